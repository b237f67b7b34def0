"""A horizontally fused Adam/AdamW step built on torch's ``foreach_map``.

:func:`foreach_map_adam_step` is the functional core; ``compile_optimizer(optimizer,
impl="foreach_map")`` installs it as ``optimizer.step``. Written against ``torch.optim.Adam``'s
single-tensor update, not the "Explicit horizontal fusion with foreach_map" tutorial (which drops
the weight-decay term); parity with ``torch.optim`` is what the tests check.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch

from .. import _dynamo
from .._moved import refuses_moved
from ..errors import UnsupportedOptimizerError

_foreach_map = _dynamo.foreach_map_op()

__all__ = ["check_foreach_map_optimizer", "foreach_map_adam_step", "make_foreach_map_step"]

Hyperparameter = float | torch.Tensor | Sequence[float | torch.Tensor]
"""A scalar shared by every tensor, or one value per tensor (how param groups are passed)."""


def _adam_update(param, grad, exp_avg, exp_avg_sq, step, lr, beta1, beta2, eps, weight_decay):
    """Adam (L2 weight decay) for one tensor; returns ``(param, exp_avg, exp_avg_sq)``.

    ``foreach_map`` wraps its function in ``FunctionWithNoFreeVars``, so every hyperparameter is
    an argument and the L2/decoupled choice is two module-level functions, not a closure.
    """
    if weight_decay != 0:
        grad = grad + weight_decay * param
    return _moments_and_update(param, grad, exp_avg, exp_avg_sq, step, lr, beta1, beta2, eps)


def _adamw_update(param, grad, exp_avg, exp_avg_sq, step, lr, beta1, beta2, eps, weight_decay):
    """AdamW (decoupled weight decay) for one tensor; returns ``(param, exp_avg, exp_avg_sq)``."""
    if weight_decay != 0:
        param = param * (1 - lr * weight_decay)
    return _moments_and_update(param, grad, exp_avg, exp_avg_sq, step, lr, beta1, beta2, eps)


def _moments_and_update(param, grad, exp_avg, exp_avg_sq, step, lr, beta1, beta2, eps):
    # Same operation order as torch.optim.Adam's single-tensor path, so results agree to rounding.
    exp_avg = torch.lerp(exp_avg, grad, 1 - beta1)
    exp_avg_sq = exp_avg_sq * beta2 + grad * grad * (1 - beta2)
    bias_correction1 = 1 - beta1**step
    bias_correction2 = 1 - beta2**step
    denom = exp_avg_sq.sqrt() / bias_correction2**0.5 + eps
    param = param - (lr / bias_correction1) * exp_avg / denom
    return param, exp_avg, exp_avg_sq


def _per_tensor(name: str, value: Hyperparameter, n: int) -> Hyperparameter:
    if isinstance(value, (float, int, torch.Tensor)):
        return value
    values = list(value)
    if len(values) != n:
        raise ValueError(
            f"foreach_map_adam_step: {name} has {len(values)} values for {n} "
            "tensors; pass one value per tensor or a single scalar"
        )
    return values


@torch.no_grad()
@refuses_moved
def foreach_map_adam_step(
    params: list[torch.Tensor],
    grads: list[torch.Tensor],
    exp_avgs: list[torch.Tensor],
    exp_avg_sqs: list[torch.Tensor],
    steps: list[torch.Tensor],
    *,
    lr: Hyperparameter,
    betas: tuple[Hyperparameter, Hyperparameter],
    eps: Hyperparameter,
    weight_decay: Hyperparameter,
    decoupled: bool,
) -> None:
    """One Adam (``decoupled=False``) or AdamW (``decoupled=True``) step, horizontally fused.
    Experimental: ``foreach_map`` is a private torch API; the label can go when it is public.

    Updates ``params``, ``exp_avgs``, ``exp_avg_sqs`` and ``steps`` in place with ``torch.optim``'s
    arithmetic (bias correction; no ``amsgrad``/``maximize``) in one ``foreach_map`` call, which
    inductor fuses into a few kernels (uncompiled it runs tensor by tensor). Hyperparameters are
    floats or 0-d tensors (a tensor lr changes without recompiling), one value or one per tensor.

    Args:
        params: the parameters (updated in place).
        grads: their gradients, same length and shapes (not sparse).
        exp_avgs: first-moment state, as ``optimizer.state[p]["exp_avg"]``.
        exp_avg_sqs: second-moment state, as ``optimizer.state[p]["exp_avg_sq"]``.
        steps: 0-d float step counts, as ``optimizer.state[p]["step"]``; incremented first.
        lr: learning rate.
        betas: the first- and second-moment decays, as ``torch.optim.Adam``'s ``betas``.
        eps: term added to the denominator.
        weight_decay: L2 penalty (Adam) or decoupled decay factor (AdamW).
        decoupled: ``True`` for AdamW's decoupled weight decay, ``False`` for Adam's L2 term.

    Raises:
        ValueError: lists or a hyperparameter sequence of the wrong length, or ``betas`` not a
            pair.
        UnsupportedOptimizerError: a sparse gradient.

    Example:
        >>> params, grads = [torch.zeros(3)], [torch.ones(3)]
        >>> m, v, steps = [torch.zeros(3)], [torch.zeros(3)], [torch.tensor(0.0)]
        >>> foreach_map_adam_step(params, grads, m, v, steps, lr=1e-3, betas=(0.9, 0.999),
        ...                       eps=1e-8, weight_decay=0.0, decoupled=False)
        >>> float(steps[0])
        1.0
    """
    n = len(params)
    lengths = {len(grads), len(exp_avgs), len(exp_avg_sqs), len(steps)}
    if lengths != {n}:
        raise ValueError(
            "foreach_map_adam_step: params, grads, exp_avgs, exp_avg_sqs and steps "
            "must have the same length; got "
            f"{[n, len(grads), len(exp_avgs), len(exp_avg_sqs), len(steps)]!r}"
        )
    if any(g.is_sparse for g in grads):
        raise UnsupportedOptimizerError(
            "foreach_map_adam_step: sparse gradients are not "
            "supported; use torch.optim.SparseAdam or dense gradients "
            "(e.g. nn.Embedding(sparse=False))"
        )
    if not isinstance(betas, (tuple, list)) or len(betas) != 2:
        raise ValueError(
            f"foreach_map_adam_step(betas={betas!r}): pass the pair (beta1, beta2), e.g. "
            "(0.9, 0.999)"
        )
    hyper = {
        name: _per_tensor(name, value, n)
        for name, value in (
            ("lr", lr),
            ("beta1", betas[0]),
            ("beta2", betas[1]),
            ("eps", eps),
            ("weight_decay", weight_decay),
        )
    }
    # A module global, not _dynamo.foreach_map_op(): dynamo would trace through its functools.cache.
    # The HOP cannot mutate its inputs, so it returns new tensors and we copy them back; the
    # copies fuse into the same kernels under inductor. Steps are a real foreach op already.
    torch._foreach_add_(steps, 1)
    update: Callable[..., Any] = _adamw_update if decoupled else _adam_update
    results = _foreach_map(
        update,
        params,
        grads,
        exp_avgs,
        exp_avg_sqs,
        steps,
        hyper["lr"],
        hyper["beta1"],
        hyper["beta2"],
        hyper["eps"],
        hyper["weight_decay"],
    )
    new_params, new_exp_avgs, new_exp_avg_sqs = zip(*results)
    torch._foreach_copy_(params, list(new_params))
    torch._foreach_copy_(exp_avgs, list(new_exp_avgs))
    torch._foreach_copy_(exp_avg_sqs, list(new_exp_avg_sqs))


# --- optimizer wiring: what compile_optimizer(optimizer, impl="foreach_map") installs ------------

# Options foreach_map_adam_step does not implement; each must be off (False/None) to use it.
_UNSUPPORTED_OPTIONS = ("amsgrad", "maximize", "differentiable", "fused")


def check_foreach_map_optimizer(optimizer: torch.optim.Optimizer) -> None:
    """Raise ``UnsupportedOptimizerError`` unless ``optimizer`` is an Adam/AdamW that
    :func:`foreach_map_adam_step` can run (no ``amsgrad``/``maximize``/``differentiable``/``fused``,
    real parameters, no mix of Adam and AdamW decay)."""
    if not isinstance(optimizer, (torch.optim.Adam, torch.optim.AdamW)):
        raise UnsupportedOptimizerError(
            f"impl='foreach_map' implements Adam and AdamW only, got {type(optimizer).__name__!r}; "
            f"use compile_optimizer(optimizer, impl='step') for other optimizers"
        )
    for index, group in enumerate(optimizer.param_groups):
        for option in _UNSUPPORTED_OPTIONS:
            if group.get(option):
                raise UnsupportedOptimizerError(
                    "impl='foreach_map' does not implement "
                    f"{option}={group[option]!r} (param group "
                    f"{index}); construct the optimizer with "
                    f"{option}=False or use impl='step'"
                )
        if any(p.is_complex() for p in group["params"]):
            raise UnsupportedOptimizerError(
                "impl='foreach_map' does not handle complex "
                f"parameters (param group {index}); use impl='step'"
            )
    if len({_is_decoupled(optimizer, g) for g in optimizer.param_groups}) > 1:
        raise UnsupportedOptimizerError(
            "impl='foreach_map' needs the same decoupled_weight_decay "
            "in every param group; use impl='step' or one optimizer "
            "per kind of weight decay"
        )


def _is_decoupled(optimizer: torch.optim.Optimizer, group: dict[str, Any]) -> bool:
    return bool(group["decoupled_weight_decay"])


def make_foreach_map_step(
    optimizer: torch.optim.Optimizer, **compile_kwargs: Any
) -> Callable[[], None]:
    """A function of no arguments that runs one compiled :func:`foreach_map_adam_step` over
    ``optimizer``, reading its lists on every call (so schedulers, ``load_state_dict`` and
    ``add_param_group`` keep working). The state must exist: ``compile_optimizer`` runs torch's own
    step first."""
    check_foreach_map_optimizer(optimizer)
    functional = torch.compile(foreach_map_adam_step, **compile_kwargs)

    def step() -> None:
        lists: dict[str, list[Any]] = {
            k: [] for k in ("params", "grads", "exp_avgs", "exp_avg_sqs", "steps")
        }
        hyper: dict[str, list[Any]] = {
            k: [] for k in ("lr", "beta1", "beta2", "eps", "weight_decay")
        }
        for group in optimizer.param_groups:
            for p in group["params"]:
                if p.grad is None:
                    continue
                state = optimizer.state[p]
                lists["params"].append(p)
                lists["grads"].append(p.grad)
                lists["exp_avgs"].append(state["exp_avg"])
                lists["exp_avg_sqs"].append(state["exp_avg_sq"])
                lists["steps"].append(state["step"])
                values = (group["lr"], *group["betas"], group["eps"], group["weight_decay"])
                for name, value in zip(hyper, values):
                    hyper[name].append(value)
        if not lists["params"]:
            return
        # One group (the common case): pass scalars, not one alias per tensor, to keep guards few.
        with_grads = [
            g for g in optimizer.param_groups if any(p.grad is not None for p in g["params"])
        ]
        one = {
            name: (values if len(with_grads) > 1 else values[0]) for name, values in hyper.items()
        }
        functional(
            **lists,
            lr=one["lr"],
            betas=(one["beta1"], one["beta2"]),
            eps=one["eps"],
            weight_decay=one["weight_decay"],
            decoupled=_is_decoupled(optimizer, optimizer.param_groups[0]),
        )

    return step
