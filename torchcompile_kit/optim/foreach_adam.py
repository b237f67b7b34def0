"""A horizontally fused Adam/AdamW step built on torch's ``foreach_map``.

``foreach_map(op, *lists)`` applies one pointwise function to every tensor of a list and lets
inductor fuse the whole list into a few kernels (the "Explicit horizontal fusion with foreach_map"
tutorial, torch >= 2.7). This module holds the functional core, :func:`foreach_map_adam_step`, and
the wiring that ``compile_optimizer(optimizer, impl="foreach_map")`` installs as ``optimizer.step``.

Written against ``torch.optim.Adam``'s single-tensor update (``torch/optim/adam.py``), not the
tutorial: the tutorial runs with a different lr than its optimizer and drops the weight-decay term.
Parity with ``torch.optim`` is what the tests check.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch

from .. import _dynamo
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
            f"foreach_map_adam_step: {name} has {len(values)} values for {n} tensors; pass one "
            f"value per tensor or a single scalar"
        )
    return values


@torch.no_grad()
def foreach_map_adam_step(
    params: list[torch.Tensor],
    grads: list[torch.Tensor],
    exp_avgs: list[torch.Tensor],
    exp_avg_sqs: list[torch.Tensor],
    steps: list[torch.Tensor],
    *,
    lr: Hyperparameter,
    beta1: Hyperparameter,
    beta2: Hyperparameter,
    eps: Hyperparameter,
    weight_decay: Hyperparameter,
    decoupled: bool,
) -> None:
    """One Adam (``decoupled=False``) or AdamW (``decoupled=True``) step, horizontally fused.

    Updates ``params``, ``exp_avgs``, ``exp_avg_sqs`` and ``steps`` in place, with the arithmetic
    of ``torch.optim.Adam`` / ``AdamW`` (bias correction, ``amsgrad=False``, ``maximize=False``).
    The per-tensor update is one ``foreach_map`` call; under ``torch.compile`` inductor emits a few
    horizontally fused kernels for the whole list. It also runs uncompiled (slowly, one tensor at
    a time).

    Hyperparameters may be Python floats or 0-d tensors (a tensor lr can change between calls
    without recompiling), either one value for all tensors or a sequence with one value per tensor
    (how :func:`compile_optimizer` passes several param groups in one call).

    Args:
        params: the parameters (updated in place).
        grads: their gradients, same length and shapes.
        exp_avgs: first-moment state, as ``optimizer.state[p]["exp_avg"]``.
        exp_avg_sqs: second-moment state, as ``optimizer.state[p]["exp_avg_sq"]``.
        steps: 0-d float tensors counting steps taken, as ``optimizer.state[p]["step"]``;
            incremented before the update, as in ``torch.optim``.
        lr: learning rate.
        beta1: first-moment decay (``betas[0]``).
        beta2: second-moment decay (``betas[1]``).
        eps: term added to the denominator.
        weight_decay: L2 penalty (Adam) or decoupled decay factor (AdamW).
        decoupled: ``True`` for AdamW's decoupled weight decay, ``False`` for Adam's L2 term.

    Returns:
        None; the lists are updated in place.

    Raises:
        ValueError: if the lists differ in length or a hyperparameter sequence has the wrong
            length.
        UnsupportedOptimizerError: if a gradient is sparse.

    Example:
        >>> params = [torch.zeros(3)]
        >>> grads = [torch.ones(3)]
        >>> m, v, steps = [torch.zeros(3)], [torch.zeros(3)], [torch.tensor(0.0)]
        >>> step = torch.compile(foreach_map_adam_step)  # doctest: +SKIP
        >>> foreach_map_adam_step(params, grads, m, v, steps, lr=1e-3, beta1=0.9, beta2=0.999,
        ...                       eps=1e-8, weight_decay=0.0, decoupled=False)
        >>> float(steps[0])
        1.0
    """
    n = len(params)
    lengths = {len(grads), len(exp_avgs), len(exp_avg_sqs), len(steps)}
    if lengths != {n}:
        raise ValueError(
            f"foreach_map_adam_step: params, grads, exp_avgs, exp_avg_sqs and steps must have the "
            f"same length; got {[n, len(grads), len(exp_avgs), len(exp_avg_sqs), len(steps)]!r}"
        )
    if any(g.is_sparse for g in grads):
        raise UnsupportedOptimizerError(
            "foreach_map_adam_step: sparse gradients are not supported; use torch.optim.SparseAdam "
            "or dense gradients (e.g. nn.Embedding(sparse=False))"
        )
    hyper = {
        name: _per_tensor(name, value, n)
        for name, value in (
            ("lr", lr),
            ("beta1", beta1),
            ("beta2", beta2),
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
    """Raise unless ``optimizer`` is an Adam/AdamW that :func:`foreach_map_adam_step` can run.

    Args:
        optimizer: the optimizer ``compile_optimizer(..., impl="foreach_map")`` was given.

    Raises:
        UnsupportedOptimizerError: for other optimizers, ``amsgrad``/``maximize``/
            ``differentiable``/``fused`` set, complex parameters, or param groups that mix Adam
            and AdamW weight decay.

    Example:
        >>> opt = torch.optim.AdamW([torch.nn.Parameter(torch.zeros(2))])
        >>> check_foreach_map_optimizer(opt)
    """
    if not isinstance(optimizer, (torch.optim.Adam, torch.optim.AdamW)):
        raise UnsupportedOptimizerError(
            f"impl='foreach_map' implements Adam and AdamW only, got {type(optimizer).__name__!r}; "
            f"use compile_optimizer(optimizer, impl='step') for other optimizers"
        )
    for index, group in enumerate(optimizer.param_groups):
        for option in _UNSUPPORTED_OPTIONS:
            if group.get(option):
                raise UnsupportedOptimizerError(
                    f"impl='foreach_map' does not implement {option}={group[option]!r} (param "
                    f"group {index}); construct the optimizer with {option}=False or use "
                    f"impl='step'"
                )
        if any(p.is_complex() for p in group["params"]):
            raise UnsupportedOptimizerError(
                f"impl='foreach_map' does not handle complex parameters (param group {index}); "
                f"use impl='step'"
            )
    if len({_is_decoupled(optimizer, g) for g in optimizer.param_groups}) > 1:
        raise UnsupportedOptimizerError(
            "impl='foreach_map' needs the same decoupled_weight_decay in every param group; "
            "use impl='step' or one optimizer per kind of weight decay"
        )


def _is_decoupled(optimizer: torch.optim.Optimizer, group: dict[str, Any]) -> bool:
    return bool(group["decoupled_weight_decay"])


def make_foreach_map_step(
    optimizer: torch.optim.Optimizer, **compile_kwargs: Any
) -> Callable[[], None]:
    """A function that runs one compiled :func:`foreach_map_adam_step` over ``optimizer``.

    It reads the current lists from ``optimizer`` on every call (params with a grad, their state,
    each group's hyperparameters), so schedulers, ``load_state_dict`` and ``add_param_group``
    keep working. The state must exist: ``compile_optimizer`` runs torch's own step for the
    first call (and whenever a parameter gains a gradient for the first time), which is the
    warm-up the foreach_map tutorial leaves to the user.

    Args:
        optimizer: an Adam/AdamW accepted by :func:`check_foreach_map_optimizer`.
        **compile_kwargs: passed to ``torch.compile`` unchanged.

    Returns:
        A function of no arguments that performs the update in place.

    Example:
        >>> p = torch.nn.Parameter(torch.zeros(2)); opt = torch.optim.Adam([p])
        >>> step = make_foreach_map_step(opt, backend="aot_eager")  # doctest: +SKIP
    """
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
        per_tensor = {
            name: (values if len(with_grads) > 1 else values[0]) for name, values in hyper.items()
        }
        functional(
            **lists, **per_tensor, decoupled=_is_decoupled(optimizer, optimizer.param_groups[0])
        )

    return step
