"""Check that a compiled model computes what the eager model computes.

:func:`check_compile_equivalence` runs deep copies eagerly and compiled on the same inputs and
compares outputs, gradients, parameters after an optimizer step and outputs after it (weights baked
into a graph show there); with ``steps=[...]`` (:class:`EquivalenceStep`) it compares after each
step of a sequence, where miscomputes between calls live.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from .. import _dynamo
from .tensor_diff import TensorDiff, compare_trees, leaves, max_abs_difference

__all__ = ["EquivalenceReport", "EquivalenceStep", "TensorDiff", "check_compile_equivalence"]

_PERTURB_SCALE = 0.1  # adapter weights get N(0, 0.1^2) noise: far from identity, still stable
_SGD_LR = 1e-2


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
    def failed_steps(self) -> list[str]:
        """The steps of a sequence with a tensor outside tolerance, in order."""
        return list(dict.fromkeys(d.step for d in self.failures if d.step))

    @property
    def worst(self) -> TensorDiff | None:
        """The tensor furthest outside (or closest to) its tolerance."""
        return max(self.diffs, key=lambda d: d.ratio, default=None)

    def summary(self) -> str:
        """A few lines: verdict, counts, the worst tensor, notes."""
        worst = self.worst
        lines = [f"compile equivalence ({self.backend}): {'OK' if self.ok else 'NOT OK'} - "
                 f"{len(self.diffs) - len(self.failures)}/{len(self.diffs)} tensors within "
                 "tolerance"]
        if worst is not None:
            lines.append(f"worst: {worst.name} max_abs={worst.max_abs:.3g} "
                         f"max_rel={worst.max_rel:.3g} ({worst.ratio:.3g}x "
                         f"tolerance){' ' + worst.note if worst.note else ''}")
        if self.failed_steps:
            lines.append(f"first failing step: {self.failed_steps[0]}")
        lines += [f"failed: {d.name}" for d in self.failures[:10]]
        lines += [f"note: {n}" for n in self.notes]
        return "\n".join(lines)

    __str__ = summary


@dataclass(kw_only=True, frozen=True, slots=True)
class EquivalenceStep:
    """One step of a sequence: ``run(model)``, called on the eager and the compiled copy in turn under
    the same seed, whose return (tensors, nested, or ``None``) is compared; it must do the same to
    both (``set_adapter``, a ``disable_adapter()`` forward, ``generate``).

    Example:
        >>> steps = [EquivalenceStep.forward(batch), EquivalenceStep.train(batch)]  # doctest: +SKIP
    """

    name: str
    """Shown in the report (``TensorDiff.step`` is ``"<index>:<name>"``)."""
    run: Callable[[nn.Module], Any]
    """Called with each copy; returns what to compare."""

    @classmethod
    def forward(cls, example_inputs: Any, *, name: str = "forward", **call_kwargs: Any) -> EquivalenceStep:
        """An eval-mode forward without gradients, ``model(**batch, **call_kwargs)`` (or ``*args``)."""

        def run(model: nn.Module) -> Any:
            _set_mode(model, training=False, dropout=False)
            with torch.no_grad():
                return _call(model, example_inputs, **call_kwargs)

        return cls(name=name, run=run)

    @classmethod
    def train(cls, example_inputs: Any, *, name: str = "train", lr: float = _SGD_LR) -> EquivalenceStep:
        """A training step with dropout off: loss, backward, SGD on the trainable parameters.

        Compares the loss, every trainable gradient and the parameters after the step; the copy
        is left in eval mode.
        """

        def run(model: nn.Module) -> Any:
            _set_mode(model, training=True, dropout=False)
            model.zero_grad(set_to_none=True)
            loss = _loss(_call(model, example_inputs))
            loss.backward()
            trainable = {n: p for n, p in model.named_parameters() if p.requires_grad and p.grad is not None}
            grads = {n: p.grad.detach().clone() for n, p in trainable.items()}
            torch.optim.SGD(list(trainable.values()), lr=lr).step()
            model.zero_grad(set_to_none=True)
            _set_mode(model, training=False, dropout=False)
            return {"loss": loss.detach(), "grad": grads,
                    "param": {n: p.detach().clone() for n, p in trainable.items()}}

        return cls(name=name, run=run)


def check_compile_equivalence(
    model: nn.Module,
    example_inputs: torch.Tensor | tuple[Any, ...] | Mapping[str, Any] | None = None,
    *,
    steps: Sequence[Any] | None = None,
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

    Two deep copies are made (``model`` is not touched), run from the same seed with dropout off
    (unless ``dropout=True``). Compared tensor by tensor: eval outputs; with ``check_grads``, the loss,
    every trainable gradient, every parameter after one SGD step and the eval outputs after it. PEFT
    adapters are first perturbed from their identity initialisation, so ignoring them cannot pass.

    Args:
        model: any uncompiled ``nn.Module``.
        example_inputs: a tensor, a tuple of positional arguments or a dict of keyword arguments.
        steps: instead, a sequence run on both copies and compared after each step: batches,
            callables ``fn(model)`` and :class:`EquivalenceStep` objects (copies start in eval mode).
        backend: ``torch.compile`` backend for the compiled copy.
        compile_kwargs: further ``torch.compile`` keyword arguments.
        check_grads: also compare the loss, gradients, one optimizer step and the outputs after it.
        rtol: relative tolerance for every tensor; default by dtype (fp32: 1e-4).
        atol: absolute tolerance for every tensor; default by dtype (fp32: 1e-5).
        compile_fn: how the copy is compiled, ``compile_fn(copy, backend=, **compile_kwargs)``;
            default ``copy.compile(...)``. Pass ``compile_peft`` or ``compile_regional`` to check those.
        dropout: keep dropout active in train mode (compiled RNG may differ from eager).
        seed: the RNG seed both runs start from.

    Returns:
        An :class:`EquivalenceReport`: ``.ok``, per-tensor ``.diffs``, ``.worst``, ``.notes``.

    Raises:
        TypeError: ``model`` is not an ``nn.Module``.
        ValueError: ``model`` is already compiled, or not exactly one of ``example_inputs`` and
            ``steps`` is given.

    Example:
        >>> report = check_compile_equivalence(model, batch, backend="aot_eager")  # doctest: +SKIP
        >>> report.ok  # doctest: +SKIP
        True
        >>> report = check_compile_equivalence(peft_model, steps=[batch, mixed_batch],
        ...                                    compile_fn=compile_peft)  # doctest: +SKIP
    """
    _check_uncompiled(model)
    if (example_inputs is None) == (steps is None):
        raise ValueError("pass exactly one of example_inputs (one batch: outputs, gradients, a "
                         "step) and steps (a sequence compared after each step); got "
                         f"example_inputs={type(example_inputs).__name__}, "
                         f"steps={type(steps).__name__}.")
    kwargs = {"backend": backend, **(compile_kwargs or {})}
    report = EquivalenceReport(ok=True, backend=_backend_name(backend))
    reference = copy.deepcopy(model)
    perturbed = _perturb_adapters(reference, seed) if hasattr(model, "peft_config") else []
    if perturbed:
        report.notes.append(f"perturbed {len(perturbed)} adapter parameters away from identity")
    eager = copy.deepcopy(reference)
    compiled = (compile_fn or _compile_in_place)(copy.deepcopy(reference), **kwargs)
    tolerance = (rtol, atol)
    if steps is not None:
        report.diffs += _compare_steps(eager, compiled, [_as_step(s) for s in steps], seed, tolerance)
        report.ok = all(d.ok for d in report.diffs)
        return report

    eager_out = _run_eval(eager, example_inputs, seed)
    report.diffs += compare_trees("output", eager_out, _run_eval(compiled, example_inputs, seed), tolerance)
    if perturbed:
        effect = max_abs_difference(_run_eval(copy.deepcopy(model), example_inputs, seed), eager_out)
        if effect == 0:
            report.notes.append("the perturbed adapters do not change the outputs: this check "
                                "cannot tell whether the compiled model applies them")
    if check_grads:
        report.diffs += _compare_training(eager, compiled, example_inputs, seed, dropout, tolerance)
    report.ok = all(d.ok for d in report.diffs)
    return report


# --- running -----------------------------------------------------------------------------------


def _check_uncompiled(model: object) -> None:
    if not isinstance(model, nn.Module):
        raise TypeError(f"model must be a torch.nn.Module, got {type(model).__name__}: {model!r:.80}")
    if _dynamo.is_torch_compile_wrapper(model):
        raise ValueError(f"model is a torch.compile wrapper ({type(model).__name__}); pass the "
                         "uncompiled module (model._orig_mod) and the compile settings via "
                         "backend=/compile_kwargs=/compile_fn=.")
    compiled = [n or "<model>" for n in _dynamo.compiled_module_names(model)]
    if compiled:
        raise ValueError(f"model is already compiled in place ({compiled[:4]!r}); a deep copy "
                         "would still run the original's compiled code. Pass the model before "
                         "compiling (torchcompile_kit.uncompile (model)) and say how to compile "
                         "it with compile_fn=, e.g. compile_fn=compile_peft.")


def _backend_name(backend: Any) -> str:
    return backend if isinstance(backend, str) else getattr(backend, "__name__", repr(backend))


def _compile_in_place(module: nn.Module, **compile_kwargs: Any) -> nn.Module:
    module.compile(**compile_kwargs)
    return module


def _call(model: nn.Module, example_inputs: Any, **call_kwargs: Any) -> Any:
    if isinstance(example_inputs, Mapping):
        return model(**example_inputs, **call_kwargs)
    if isinstance(example_inputs, (tuple, list)):
        return model(*example_inputs, **call_kwargs)
    return model(example_inputs, **call_kwargs)


def _as_step(item: Any) -> EquivalenceStep:
    if isinstance(item, EquivalenceStep):
        return item
    if callable(item) and not isinstance(item, (nn.Module, torch.Tensor)):
        return EquivalenceStep(name=getattr(item, "__name__", "call"), run=item)
    return EquivalenceStep.forward(item)


def _compare_steps(eager: nn.Module, compiled: nn.Module, steps: list[EquivalenceStep], seed: int,
                   tolerance: tuple) -> list[TensorDiff]:
    for model in (eager, compiled):
        _set_mode(model, training=False, dropout=False)
    diffs: list[TensorDiff] = []
    for index, step in enumerate(steps):
        label = f"{index}:{step.name}"
        results: list[Any] = []
        for model in (eager, compiled):
            with torch.random.fork_rng():
                torch.manual_seed(seed + index)  # e.g. add_adapter initialises alike in both
                try:
                    results.append(("ok", step.run(model)))
                except Exception as error:  # noqa: BLE001 - reported as a difference
                    results.append(("raised", f"{type(error).__name__}: {error}"))
        (eager_kind, eager_value), (compiled_kind, compiled_value) = results
        if eager_kind == compiled_kind == "ok":
            step_diffs = compare_trees(label, eager_value, compiled_value, tolerance)
        elif eager_kind == compiled_kind and eager_value.split(":")[0] == compiled_value.split(":")[0]:
            step_diffs = []  # both raised alike: the step is equivalent (and says so in neither)
        else:
            side = "compiled" if compiled_kind == "raised" else "eager"
            raised = compiled_value if side == "compiled" else eager_value
            step_diffs = [TensorDiff(name=label, max_abs=math.inf, max_rel=math.inf, ratio=math.inf,
                                     ok=False, note=f"only the {side} run raised: {str(raised)[:300]}")]
        for diff in step_diffs:
            diff.step = label
        diffs += step_diffs
    return diffs


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
    tensors = [t for _, t in leaves(output) if t.is_floating_point() and t.requires_grad]
    if not tensors:
        raise ValueError("check_grads=True needs a differentiable output: the model returned no "
                         "'loss' and no floating-point tensor that requires grad. Pass "
                         "check_grads=False, or labels.")
    return sum(t.float().square().mean() for t in tensors)


def _compare_training(eager: nn.Module, compiled: nn.Module, example_inputs: Any, seed: int,
                      dropout: bool, tolerance: tuple) -> list[TensorDiff]:
    losses = []
    for model in (eager, compiled):
        _set_mode(model, training=True, dropout=dropout)
        model.zero_grad(set_to_none=True)
        with torch.random.fork_rng():
            torch.manual_seed(seed)
            loss = _loss(_call(model, example_inputs))
        loss.backward()
        losses.append(loss.detach())
    diffs = compare_trees("loss", losses[0], losses[1], tolerance)
    eager_params = dict(eager.named_parameters())
    compiled_params = dict(compiled.named_parameters())
    for name, param in eager_params.items():
        if param.requires_grad:
            diffs += compare_trees(f"grad.{name}", param.grad, compiled_params[name].grad, tolerance)
    for model in (eager, compiled):
        trainable = [p for p in model.parameters() if p.requires_grad and p.grad is not None]
        torch.optim.SGD(trainable, lr=_SGD_LR).step()
    for name, param in eager_params.items():
        if param.requires_grad:
            diffs += compare_trees(f"param_after_step.{name}", param, compiled_params[name], tolerance)
    after = [_run_eval(model, example_inputs, seed) for model in (eager, compiled)]
    return diffs + compare_trees("output_after_step", after[0], after[1], tolerance)


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
