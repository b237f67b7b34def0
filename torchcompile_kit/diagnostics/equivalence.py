"""Check that a compiled model computes what the eager model computes.

``torch.compile`` failing loudly is the easy case; the dangerous one is a compiled model that runs
and is wrong (peft's guide: "if you don't see an error, it doesn't necessarily mean that
torch.compile worked correctly"). :func:`check_compile_equivalence` runs deep copies of a model
eagerly and compiled on the same inputs and compares outputs, gradients, parameters after one
optimizer step, and outputs after that step (which catches weights baked into a graph).
"""

from __future__ import annotations

import copy
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from .. import _dynamo

__all__ = ["EquivalenceReport", "TensorDiff", "check_compile_equivalence"]

# (rtol, atol) per dtype: compiled kernels reorder reductions, so these are looser than
# torch.testing's defaults; measured inductor/eager gaps on the tiny test models are ~3e-7 (fp32).
_TOLERANCES: dict[torch.dtype, tuple[float, float]] = {
    torch.float64: (1e-7, 1e-7),
    torch.float32: (1e-4, 1e-5),
    torch.float16: (1e-2, 1e-3),
    torch.bfloat16: (5e-2, 1e-2),
}
_PERTURB_SCALE = 0.1  # adapter weights get N(0, 0.1^2) noise: far from identity, still stable
_SGD_LR = 1e-2


@dataclass(kw_only=True, slots=True)
class TensorDiff:
    """How one tensor differs between the eager and the compiled run."""

    name: str
    """``output.logits``, ``loss``, ``grad.<param>``, ``param_after_step.<param>`` or
    ``output_after_step.<key>``."""
    max_abs: float
    """Largest absolute elementwise difference (``inf`` when missing on one side)."""
    max_rel: float
    """``max_abs`` divided by the largest magnitude of the eager tensor."""
    ratio: float
    """Largest ``|compiled - eager| / (atol + rtol * |eager|)``; at most 1 is within tolerance."""
    ok: bool
    note: str = ""
    """Why the tensors could not be compared elementwise (missing, shape), if so."""


@dataclass(kw_only=True, slots=True)
class EquivalenceReport:
    """Result of :func:`check_compile_equivalence`."""

    ok: bool
    """Every compared tensor is within tolerance."""
    backend: str
    diffs: list[TensorDiff] = field(default_factory=list)
    """One entry per compared tensor."""
    notes: list[str] = field(default_factory=list)
    """What was perturbed, and anything that weakens the check."""

    @property
    def failures(self) -> list[TensorDiff]:
        """The tensors outside tolerance."""
        return [d for d in self.diffs if not d.ok]

    @property
    def worst(self) -> TensorDiff | None:
        """The tensor furthest outside (or closest to) its tolerance."""
        return max(self.diffs, key=lambda d: d.ratio, default=None)

    def summary(self) -> str:
        """A few lines: verdict, counts, the worst tensor, notes."""
        worst = self.worst
        lines = [
            f"compile equivalence ({self.backend}): {'OK' if self.ok else 'NOT OK'} - "
            f"{len(self.diffs) - len(self.failures)}/{len(self.diffs)} tensors within tolerance"
        ]
        if worst is not None:
            lines.append(
                f"worst: {worst.name} max_abs={worst.max_abs:.3g} max_rel={worst.max_rel:.3g} "
                f"({worst.ratio:.3g}x tolerance){' ' + worst.note if worst.note else ''}"
            )
        lines += [f"failed: {d.name}" for d in self.failures[:10]]
        lines += [f"note: {n}" for n in self.notes]
        return "\n".join(lines)

    __str__ = summary


def check_compile_equivalence(
    model: nn.Module,
    example_inputs: torch.Tensor | tuple[Any, ...] | Mapping[str, Any],
    *,
    backend: Any = "inductor",
    compile_kwargs: dict[str, Any] | None = None,
    check_grads: bool = True,
    rtol: float | None = None,
    atol: float | None = None,
    compile_fn: Callable[..., nn.Module] | None = None,
    dropout: bool = False,
    seed: int = 0,
) -> EquivalenceReport:
    """Run ``model`` eagerly and compiled on the same inputs and compare everything that matters.

    Two deep copies are made; ``model`` itself is not touched. Both run under the same RNG seed
    with dropout off (unless ``dropout=True``). Compared, tensor by tensor: outputs in eval mode;
    with ``check_grads``, the loss (the output's ``loss``, else the mean square of the outputs)
    and the gradient of every trainable parameter in train mode, every parameter after one SGD
    step, and the eval outputs after that step. For PEFT models, trainable parameters are first
    perturbed away from their identity initialisation (LoRA B is zero, IA3 is one), identically
    in both copies, so a compiled model that ignores the adapter cannot pass.

    Args:
        model: any uncompiled ``nn.Module``.
        example_inputs: a tensor (``model(x)``), a tuple of positional arguments
            (``model(*args)``) or a dict of keyword arguments (``model(**batch)``, HF style).
        backend: ``torch.compile`` backend for the compiled copy.
        compile_kwargs: further ``torch.compile`` keyword arguments (``mode``, ``options``...).
        check_grads: also compare the loss, gradients, one optimizer step and the outputs after it.
        rtol: relative tolerance for every tensor; default by dtype (fp32: 1e-4).
        atol: absolute tolerance for every tensor; default by dtype (fp32: 1e-5).
        compile_fn: how the copy is compiled, called as
            ``compile_fn(copy, backend=backend, **compile_kwargs)`` and returning the compiled
            module; default ``copy.compile(...)`` in place. Pass
            ``torchcompile_kit.compile_peft`` or ``compile_regional`` to check those.
        dropout: keep dropout modules active in train mode (compiled RNG may differ from eager).
        seed: the RNG seed both runs start from.

    Returns:
        An :class:`EquivalenceReport`: ``.ok``, per-tensor ``.diffs``, ``.worst``, ``.notes``.

    Raises:
        TypeError: ``model`` is not an ``nn.Module``.
        ValueError: ``model`` is already compiled (``torch.compile`` wrapper or ``.compile()``).

    Example:
        >>> report = check_compile_equivalence(model, batch, backend="aot_eager")  # doctest: +SKIP
        >>> report.ok, report.worst.name  # doctest: +SKIP
        (True, 'grad.base_model.model.transformer.h.0.attn.c_attn.lora_B.default.weight')
    """
    _check_uncompiled(model)
    kwargs = {"backend": backend, **(compile_kwargs or {})}
    report = EquivalenceReport(ok=True, backend=_backend_name(backend))
    reference = copy.deepcopy(model)
    perturbed = _perturb_adapters(reference, seed) if hasattr(model, "peft_config") else []
    if perturbed:
        report.notes.append(f"perturbed {len(perturbed)} adapter parameters away from identity")
    eager = copy.deepcopy(reference)
    compiled = (compile_fn or _compile_in_place)(copy.deepcopy(reference), **kwargs)
    tolerance = (rtol, atol)

    eager_out = _run_eval(eager, example_inputs, seed)
    report.diffs += _compare_tree("output", eager_out, _run_eval(compiled, example_inputs, seed), tolerance)
    if perturbed:
        effect = _max_abs_tree(_run_eval(copy.deepcopy(model), example_inputs, seed), eager_out)
        if effect == 0:
            report.notes.append(
                "the perturbed adapters do not change the outputs: this check cannot tell whether "
                "the compiled model applies them"
            )
    if check_grads:
        report.diffs += _compare_training(eager, compiled, example_inputs, seed, dropout, tolerance)
    report.ok = all(d.ok for d in report.diffs)
    return report


# --- running -----------------------------------------------------------------------------------


def _check_uncompiled(model: object) -> None:
    if not isinstance(model, nn.Module):
        raise TypeError(f"model must be a torch.nn.Module, got {type(model).__name__}: {model!r:.80}")
    if _dynamo.is_torch_compile_wrapper(model):
        raise ValueError(
            f"model is a torch.compile wrapper ({type(model).__name__}); pass the uncompiled module "
            "(model._orig_mod) and the compile settings via backend=/compile_kwargs=/compile_fn=."
        )
    compiled = [n or "<model>" for n in _dynamo.compiled_module_names(model)]
    if compiled:
        raise ValueError(
            f"model is already compiled in place ({compiled[:4]!r}); a deep copy would still run the "
            "original's compiled code. Pass the model before compiling (torchcompile_kit.uncompile "
            "(model)) and say how to compile it with compile_fn=, e.g. compile_fn=compile_peft."
        )


def _backend_name(backend: Any) -> str:
    return backend if isinstance(backend, str) else getattr(backend, "__name__", repr(backend))


def _compile_in_place(module: nn.Module, **compile_kwargs: Any) -> nn.Module:
    module.compile(**compile_kwargs)
    return module


def _call(model: nn.Module, example_inputs: Any) -> Any:
    if isinstance(example_inputs, Mapping):
        return model(**example_inputs)
    if isinstance(example_inputs, (tuple, list)):
        return model(*example_inputs)
    return model(example_inputs)


def _set_mode(model: nn.Module, *, training: bool, dropout: bool) -> None:
    model.train(training)
    if training and not dropout:
        for module in model.modules():
            if isinstance(module, nn.modules.dropout._DropoutNd):
                module.eval()  # an eval dropout is the identity


def _run_eval(model: nn.Module, example_inputs: Any, seed: int) -> Any:
    _set_mode(model, training=False, dropout=False)
    with torch.no_grad(), torch.random.fork_rng():
        torch.manual_seed(seed)
        return _call(model, example_inputs)


def _loss(output: Any) -> torch.Tensor:
    loss = output.get("loss") if isinstance(output, Mapping) else getattr(output, "loss", None)
    if isinstance(loss, torch.Tensor) and loss.numel() == 1:
        return loss
    leaves = [t for _, t in _leaves(output) if t.is_floating_point() and t.requires_grad]
    if not leaves:
        raise ValueError(
            "check_grads=True needs a differentiable output: the model returned no 'loss' and no "
            "floating-point tensor that requires grad. Pass check_grads=False, or labels."
        )
    return sum(t.float().square().mean() for t in leaves)


def _compare_training(
    eager: nn.Module, compiled: nn.Module, example_inputs: Any, seed: int, dropout: bool, tolerance: tuple
) -> list[TensorDiff]:
    losses = []
    for model in (eager, compiled):
        _set_mode(model, training=True, dropout=dropout)
        model.zero_grad(set_to_none=True)
        with torch.random.fork_rng():
            torch.manual_seed(seed)
            loss = _loss(_call(model, example_inputs))
        loss.backward()
        losses.append(loss.detach())
    diffs = _compare_tree("loss", losses[0], losses[1], tolerance)
    eager_params = dict(eager.named_parameters())
    compiled_params = dict(compiled.named_parameters())
    for name, param in eager_params.items():
        if param.requires_grad:
            diffs += _compare_tree(f"grad.{name}", param.grad, compiled_params[name].grad, tolerance)
    for model in (eager, compiled):
        trainable = [p for p in model.parameters() if p.requires_grad and p.grad is not None]
        torch.optim.SGD(trainable, lr=_SGD_LR).step()
    for name, param in eager_params.items():
        if param.requires_grad:
            diffs += _compare_tree(f"param_after_step.{name}", param, compiled_params[name], tolerance)
    after = [_run_eval(model, example_inputs, seed) for model in (eager, compiled)]
    return diffs + _compare_tree("output_after_step", after[0], after[1], tolerance)


def _perturb_adapters(model: nn.Module, seed: int) -> list[str]:
    generator = torch.Generator().manual_seed(seed)
    names = []
    with torch.no_grad():
        for name, param in model.named_parameters():
            if param.requires_grad and param.is_floating_point():
                noise = torch.randn(param.shape, generator=generator, dtype=torch.float32)
                param.add_((noise * _PERTURB_SCALE).to(param.device, param.dtype))
                names.append(name)
    return names


# --- comparing ---------------------------------------------------------------------------------


def _leaves(tree: Any, prefix: str = "") -> list[tuple[str, torch.Tensor]]:
    if isinstance(tree, torch.Tensor):
        return [(prefix, tree)]
    join = (lambda key: f"{prefix}.{key}") if prefix else str
    if isinstance(tree, Mapping):
        return [leaf for key, value in tree.items() for leaf in _leaves(value, join(key))]
    if isinstance(tree, (tuple, list)):
        return [leaf for i, value in enumerate(tree) for leaf in _leaves(value, join(i))]
    return []  # caches and other objects are not compared


def _compare_tree(prefix: str, eager: Any, compiled: Any, tolerance: tuple) -> list[TensorDiff]:
    if eager is None or compiled is None:
        if eager is None and compiled is None:
            return []
        side = "compiled" if compiled is None else "eager"
        return [TensorDiff(name=prefix, max_abs=math.inf, max_rel=math.inf, ratio=math.inf,
                           ok=False, note=f"missing in the {side} run")]
    left, right = dict(_leaves(eager)), dict(_leaves(compiled))
    diffs = []
    for key in sorted(left.keys() | right.keys()):
        name = f"{prefix}.{key}" if key else prefix
        if key not in left or key not in right:
            side = "compiled" if key not in right else "eager"
            diffs.append(TensorDiff(name=name, max_abs=math.inf, max_rel=math.inf, ratio=math.inf,
                                    ok=False, note=f"missing in the {side} run"))
        else:
            diffs.append(_compare(name, left[key], right[key], tolerance))
    return diffs


def _compare(name: str, eager: torch.Tensor, compiled: torch.Tensor, tolerance: tuple) -> TensorDiff:
    if eager.shape != compiled.shape:
        note = f"shape {tuple(compiled.shape)} != eager {tuple(eager.shape)}"
        return TensorDiff(name=name, max_abs=math.inf, max_rel=math.inf, ratio=math.inf, ok=False, note=note)
    default_rtol, default_atol = _TOLERANCES.get(eager.dtype, (0.0, 0.0))  # integers: exact
    rtol = default_rtol if tolerance[0] is None else tolerance[0]
    atol = default_atol if tolerance[1] is None else tolerance[1]
    a, b = eager.detach().double().cpu(), compiled.detach().double().cpu()
    diff = (a - b).abs()
    diff[a.isnan() & b.isnan()] = 0.0
    diff = diff.nan_to_num(nan=math.inf)
    if diff.numel() == 0:
        return TensorDiff(name=name, max_abs=0.0, max_rel=0.0, ratio=0.0, ok=True)
    max_abs = diff.max().item()
    scale = a.abs().nan_to_num(nan=0.0, posinf=0.0).max().item()
    bound = atol + rtol * a.abs().nan_to_num(nan=0.0)
    ratio = torch.where(diff == 0, 0.0, diff / bound).max().item()  # x/0 is inf: exact dtypes
    max_rel = max_abs / scale if scale > 0 else (0.0 if max_abs == 0 else math.inf)
    return TensorDiff(name=name, max_abs=max_abs, max_rel=max_rel, ratio=ratio, ok=ratio <= 1.0)


def _max_abs_tree(first: Any, second: Any) -> float:
    right = dict(_leaves(second))
    return max(
        ((t.detach().double() - right[k].detach().double()).abs().max().item()
         for k, t in _leaves(first) if k in right and t.shape == right[k].shape and t.numel()),
        default=0.0,
    )
