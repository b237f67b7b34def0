"""Check that a compiled model computes what the eager model computes.

:func:`check_compile_equivalence` runs deep copies eagerly and compiled on the same inputs and
compares outputs, gradients, parameters after an optimizer step and outputs after it (weights baked
into a graph show there); with ``steps=[...]`` (:class:`EquivalenceStep`) it compares after each
step of a sequence, where miscomputes between calls live. A third copy runs at higher precision as
the comparator's reference (:mod:`.comparator`, :mod:`.reference`).
"""

from __future__ import annotations

import contextlib
import copy
import inspect
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from .. import _dynamo
from .._checks import check_compile_kwargs
from .._collect import Collector
from .._moved import refuses_moved
from .comparator import TensorDiff, judge_trees, leaves, max_abs_difference, rms_differences
from .compare import (
    ReferenceUnavailable,
    Rerun,
    Sides,
    backend_name,
    compare,
    fork_rng,
    rng_moved,
    rng_state,
    same_draws,
)
from .reference import Reference, at_precision, autocast_active, casting_inputs, reference_dtype

__all__ = [
    "EquivalenceReport",
    "EquivalenceStep",
    "TensorDiff",
    "check_compile_equivalence",
    "note_ran_eagerly",
]

_PERTURB_SCALE = 0.1  # adapter weights get N(0, 0.1^2) noise: far from identity, still stable
_SGD_LR = 1e-2
SEED = 0  # every run starts from it, so eager, compiled and reference draw alike


_RAN_EAGERLY: Collector[str] = Collector()


def note_ran_eagerly(module: nn.Module) -> None:
    """Tell a running check that a compiled ``module``'s call ran eagerly on purpose (regional
    compile runs a call that passes or builds a KV cache eagerly): what it compares of that call
    is eager against eager."""
    _RAN_EAGERLY.add(type(module).__name__)


@dataclass(kw_only=True, slots=True)
class EquivalenceReport:
    """Result of :func:`check_compile_equivalence`."""

    ok: bool
    """Tensors were compared and none was judged wrong."""
    backend: str
    diffs: list[TensorDiff] = field(default_factory=list)
    """One entry per compared tensor."""
    reference: Reference = field(default_factory=lambda: Reference(dtype=None))
    """What the tensors were judged against (``reference.describe()``)."""
    notes: list[str] = field(default_factory=list)
    """What was perturbed, and anything that weakens the check."""
    not_compared: list[str] = field(default_factory=list)
    """What was left out because the compiled copy ran it eagerly (a KV cache under regional
    compile), eager against eager saying nothing: a step of a sequence, or a part of one batch
    (``"output"``, ``"loss"``, ...)."""

    @property
    def failures(self) -> list[TensorDiff]:
        """The tensors judged wrong."""
        return [d for d in self.diffs if not d.ok]

    @property
    def failed_steps(self) -> list[str]:
        """The steps of a sequence with a tensor outside tolerance, in order."""
        return list(dict.fromkeys(d.step for d in self.failures if d.step))

    @property
    def worst(self) -> TensorDiff | None:
        """The tensor that used the most of its allowance (:attr:`TensorDiff.ratio`)."""
        return max(self.diffs, key=lambda d: d.ratio, default=None)

    def summary(self) -> str:
        """A few lines: verdict, counts, what it was judged against, the worst tensor, notes."""
        worst = self.worst
        verdict = "OK" if self.ok else "NOT OK" if self.diffs else "NOTHING COMPARED"
        lines = [
            (
                f"compile equivalence ({self.backend}): {verdict} - "
                f"{len(self.diffs) - len(self.failures)}/{len(self.diffs)} tensors pass"
            ),
            f"judged against: {self.reference.describe()}",
        ]
        if worst is not None:
            lines.append(f"worst: {worst.explain()}")
        if self.failed_steps:
            lines.append(f"first failing step: {self.failed_steps[0]}")
        lines += [f"failed: {d.name}" for d in self.failures[:10]]
        lines += [f"note: {n}" for n in self.notes]
        return "\n".join(lines)

    __str__ = summary


@dataclass(kw_only=True, frozen=True, slots=True)
class EquivalenceStep:
    """One step of a sequence: ``run(model)``, called on the eager and the compiled copy in turn
    under the same seed, whose return (tensors, nested, or ``None``) is compared; it must do the
    same to both (``set_adapter``, a ``disable_adapter()`` forward, ``generate``).

    Example:
        >>> steps = [EquivalenceStep.forward(batch), EquivalenceStep.train(batch)]  # doctest: +SKIP
    """

    name: str
    """Shown in the report (``TensorDiff.step`` is ``"<index>:<name>"``)."""
    run: Callable[[nn.Module], Any]
    """Called with each copy; returns what to compare."""

    @classmethod
    def forward(
        cls, example_inputs: Any, *, name: str = "forward", **call_kwargs: Any
    ) -> EquivalenceStep:
        """An eval-mode forward without gradients, ``model(**batch, **call_kwargs)``
        (or ``*args``); ``use_cache=False`` unless the batch or ``call_kwargs`` set it (with a KV
        cache, regionally compiled blocks run eagerly)."""

        def run(model: nn.Module) -> Any:
            _set_mode(model, training=False)
            kwargs = _without_cache(model, example_inputs) | call_kwargs
            with torch.no_grad():
                return _call(model, example_inputs, **kwargs)

        return cls(name=name, run=run)

    @classmethod
    def train(
        cls, example_inputs: Any, *, name: str = "train", lr: float = _SGD_LR
    ) -> EquivalenceStep:
        """A training step with dropout off: loss, backward, SGD on the trainable parameters.

        Compares the loss, every trainable gradient and the parameters after the step; the copy
        is left in eval mode.
        """

        return cls(name=name, run=lambda model: _sgd_step(model, example_inputs, lr))


@refuses_moved
def check_compile_equivalence(
    model: nn.Module,
    example_inputs: torch.Tensor | tuple[Any, ...] | Mapping[str, Any] | None = None,
    *,
    steps: Sequence[Any] | None = None,
    compile_fn: Callable[..., nn.Module] | None = None,
    tolerance: tuple[float, float] | None = None,
    check_grads: bool = True,
    **compile_kwargs: Any,
) -> EquivalenceReport:
    """Run ``model`` eagerly and compiled on the same inputs and compare everything that matters.

    Deep copies are made (``model`` is not touched) and run from the same seed (0) with dropout
    off (compiled random numbers need not match eager's), under the autocast the call is made in.
    Compared tensor by tensor: eval outputs; with ``check_grads``, the loss, every trainable
    gradient, every parameter after one SGD step and the eval outputs after it. Each tensor is
    judged by the comparator (docs/diagnostics.md, "What equal to eager means"): a third copy runs
    the same at higher precision (float64; float32 for a bf16/fp16 or autocast run) with autocast
    off, and a tensor is wrong when the compiled run is more than 3x farther from it than eager is
    (plus a rounding floor, and the run-to-run noise, measured when something fails). PEFT adapters
    are first perturbed from their identity initialisation, so ignoring them cannot pass.

    Args:
        model: any uncompiled ``nn.Module``.
        example_inputs: a tensor, a tuple of positional arguments or a dict of keyword arguments.
        steps: instead, a sequence run on both copies and compared after each step: batches,
            callables ``fn(model)`` and :class:`EquivalenceStep` objects (copies start in eval
            mode).
        compile_fn: how the copy is compiled, ``compile_fn(copy, **compile_kwargs)``; default
            ``copy.compile(...)``. Pass ``compile_peft`` or ``compile_regional`` to check those.
        tolerance: ``(rtol, atol)``, a fixed tolerance instead of the comparator's rule: a tensor
            passes when ``|compiled - eager| <= atol + rtol * |eager|`` elementwise.
        check_grads: also compare the loss, gradients, one optimizer step and the outputs after it.
        **compile_kwargs: ``torch.compile``'s keywords (``backend``, default ``"inductor"``,
            ``mode``, ``dynamic``, ...) or ``compile_fn``'s.

    Returns:
        An :class:`EquivalenceReport`: ``.ok``, per-tensor ``.diffs``, ``.worst``, ``.reference``,
        ``.notes``.

    Raises:
        TypeError: ``model`` is not an ``nn.Module``, or a keyword is neither ``torch.compile``'s
            nor ``compile_fn``'s.
        ValueError: ``model`` is already compiled, or not exactly one of ``example_inputs`` and
            ``steps`` is given.

    Example:
        >>> report = check_compile_equivalence(model, batch, backend="aot_eager")  # doctest: +SKIP
        >>> report.ok  # doctest: +SKIP
        True
        >>> with torch.autocast("cpu", dtype=torch.bfloat16):  # doctest: +SKIP
        ...     report = check_compile_equivalence(model, batch)  # judged against float32
        >>> report = check_compile_equivalence(peft_model, steps=[batch, mixed_batch],
        ...                                    compile_fn=compile_peft)  # doctest: +SKIP
    """
    _check_uncompiled(model)
    if (example_inputs is None) == (steps is None):
        raise ValueError(
            "pass exactly one of example_inputs (one batch: outputs, gradients, a "
            "step) and steps (a sequence compared after each step); got "
            f"example_inputs={type(example_inputs).__name__}, "
            f"steps={type(steps).__name__}."
        )
    tolerance = _check_tolerance(tolerance)
    _check_keywords(compile_fn, compile_kwargs)
    kwargs = {"backend": "inductor", **compile_kwargs}
    report = EquivalenceReport(ok=True, backend=backend_name(kwargs["backend"]))
    seed = SEED
    start = copy.deepcopy(model)
    perturbed = _perturb_adapters(start, seed) if hasattr(model, "peft_config") else []
    if perturbed:
        report.notes.append(f"perturbed {len(perturbed)} adapter parameters away from identity")
    eager = copy.deepcopy(start)
    compiled = (compile_fn or _compile_in_place)(copy.deepcopy(start), **kwargs)
    if steps is not None:
        sequence = [_as_step(s) for s in steps]
        run: Callable[[nn.Module], Any] = lambda m: _run_steps(m, sequence, seed)
    else:  # one unlabelled step: the same judging, its names without a step prefix
        run = lambda m: [_one_batch(m, example_inputs, seed, check_grads)]
    random = steps is None and check_grads and _draws_random(start, example_inputs, seed)
    eager_result = run(eager)
    with same_draws(report.backend) if random else contextlib.nullcontext():
        compiled_result = run(compiled)
    if random:
        report.notes.append(
            "random ops: a training forward draws random numbers (a functional "
            "dropout?); the compiled copy ran with inductor's fallback_random, so "
            "both sides drew the same ones (inductor's own random kernels were "
            "not compared)"
        )
    verdict = compare(
        Sides(
            eager=eager_result,
            compiled=compiled_result,
            reference=lambda dtype: _reference_run(start, dtype, run),
            precision=reference_dtype(start, autocast=autocast_active(start)),
            rerun=lambda: _rerun(start, compiled, run, is_steps=steps is not None),
            judge=_judge,
            distance=_rms,
        ),
        tolerance=tolerance,
    )
    report.diffs, report.reference = verdict.diffs, verdict.reference
    report.notes += verdict.notes
    if steps is None and any(
        isinstance(m, nn.modules.dropout._DropoutNd) and m.p > 0 for m in model.modules()
    ):
        report.notes.append("dropout: off in every run (eval dropout)")
    _leave_out_eager_steps(report, compiled_result)
    if perturbed and steps is None:
        effect = max_abs_difference(
            _run_eval(copy.deepcopy(model), example_inputs, seed), eager_result[0].value["output"]
        )
        if effect == 0:
            report.notes.append(
                "the perturbed adapters do not change the outputs: this check "
                "cannot tell whether the compiled model applies them"
            )
    report.ok = bool(report.diffs) and all(d.ok for d in report.diffs)
    return report


def _leave_out_eager_steps(report: EquivalenceReport, compiled: list[_StepResult]) -> None:
    """Parts of a step whose compiled side ran calls eagerly are not evidence: their tensors leave
    the report, which says why and how to compare them compiled."""
    modules: dict[str, None] = {}
    for result in compiled:
        for part, names in result.ran_eagerly.items():
            prefix = ".".join(filter(None, [result.label, part]))  # "": the whole step
            report.diffs = [d for d in report.diffs if not _within(d, result.label, prefix)]
            report.not_compared.append(prefix or "batch")
            modules |= dict.fromkeys(names)
    if modules:
        report.notes.append(
            f"not compared: {', '.join(report.not_compared)}: the compiled copy ran "
            f"{', '.join(modules)} eagerly there (a call that passes or builds a KV cache, which "
            "regionally compiled blocks run eagerly), so both sides were eager; pass "
            "use_cache=False to compare them compiled"
        )


def _within(diff: TensorDiff, step: str, prefix: str) -> bool:
    """Whether ``diff`` is a tensor of ``step`` under ``prefix`` (``""``: any of the step's)."""
    if diff.step != step:
        return False
    return not prefix or diff.name == prefix or diff.name.startswith(f"{prefix}.")


# --- running -----------------------------------------------------------------------------------


def _check_uncompiled(model: object) -> None:
    if not isinstance(model, nn.Module):
        raise TypeError(
            f"model must be a torch.nn.Module, got {type(model).__name__}: {model!r:.80}"
        )
    if _dynamo.is_torch_compile_wrapper(model):
        raise ValueError(
            f"model is a torch.compile wrapper ({type(model).__name__}); pass the "
            "uncompiled module (model._orig_mod) and the compile settings via "
            "torch.compile's keywords or compile_fn=."
        )
    compiled = [n or "<model>" for n in _dynamo.compiled_module_names(model)]
    if compiled:
        raise ValueError(
            f"model is already compiled in place ({compiled[:4]!r}); a deep copy "
            "would still run the original's compiled code. Pass the model before "
            "compiling (torchcompile_kit.uncompile (model)) and say how to compile "
            "it with compile_fn=, e.g. compile_fn=compile_peft."
        )


def _check_keywords(compile_fn: Callable[..., Any] | None, compile_kwargs: dict[str, Any]) -> None:
    """Refuse a keyword before anything is copied or compiled: one that was moved, or one neither
    ``torch.compile`` nor ``compile_fn`` takes (any, when ``compile_fn`` takes ``**kwargs``)."""
    takes = inspect.signature(compile_fn).parameters if compile_fn is not None else {}
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in takes.values()):
        takes = compile_kwargs
    check_compile_kwargs(compile_kwargs, caller="check_compile_equivalence", takes=takes)


def _check_tolerance(tolerance: tuple[float, float] | None) -> tuple[float, float] | None:
    if tolerance is None:
        return None
    if (
        not isinstance(tolerance, tuple)
        or len(tolerance) != 2
        or not all(isinstance(t, (int, float)) and t >= 0 for t in tolerance)
    ):
        raise ValueError(
            f"tolerance={tolerance!r}: pass (rtol, atol), two numbers >= 0, e.g. (1e-4, 1e-5), "
            "or None for the comparator's rule"
        )
    return float(tolerance[0]), float(tolerance[1])


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


def _set_mode(model: nn.Module, *, training: bool) -> None:
    """Train or eval mode, dropout modules off either way (compiled random numbers need not be
    eager's)."""
    model.train(training)
    if training:
        for module in model.modules():
            if isinstance(module, nn.modules.dropout._DropoutNd):
                module.eval()  # an eval dropout is the identity


def _draws_random(model: nn.Module, example_inputs: Any, seed: int) -> bool:
    """Whether a training forward of a copy of ``model`` moves a random generator (the CPU's, and
    the model's accelerators'): a dropout the dropout-off mode cannot reach
    (``F.dropout(x, p, training=self.training)``). Inductor draws such numbers its own way unless
    both sides draw alike (:func:`~.compare.same_draws`), which is not a miscompute."""
    probe = copy.deepcopy(model)
    _set_mode(probe, training=True)
    with torch.no_grad(), fork_rng(probe):
        torch.manual_seed(seed)
        before = rng_state(probe)
        _call(probe, example_inputs)
        return rng_moved(before, rng_state(probe))


def _run_eval(model: nn.Module, example_inputs: Any, seed: int) -> Any:
    _set_mode(model, training=False)
    with torch.no_grad(), torch.random.fork_rng():
        torch.manual_seed(seed)
        return _call(model, example_inputs, **_without_cache(model, example_inputs))


def _without_cache(model: nn.Module, example_inputs: Any) -> dict[str, Any]:
    """``use_cache=False`` for an eval forward of a model whose config builds a KV cache, unless
    the inputs ask for one: regional compile runs a cache-building call eagerly, so with it both
    sides would be eager."""
    asked = isinstance(example_inputs, Mapping) and "use_cache" in example_inputs
    config = getattr(model, "config", None)
    if asked or not getattr(config, "use_cache", False):
        return {}
    takes = inspect.signature(model.forward).parameters.values()
    passes_on = any(p.kind is p.VAR_KEYWORD for p in takes)  # a PeftModel: to its base model
    return {"use_cache": False} if passes_on or any(p.name == "use_cache" for p in takes) else {}


def _loss(output: Any) -> torch.Tensor:
    loss = output.get("loss") if isinstance(output, Mapping) else getattr(output, "loss", None)
    if isinstance(loss, torch.Tensor) and loss.numel() == 1:
        return loss
    tensors = [t for _, t in leaves(output) if t.is_floating_point() and t.requires_grad]
    if not tensors:
        raise ValueError(
            "check_grads=True needs a differentiable output: the model returned no "
            "'loss' and no floating-point tensor that requires grad. Pass "
            "check_grads=False, or labels."
        )
    # 16-bit outputs are summed in float32; a float64 reference keeps its precision
    return sum(t.to(torch.promote_types(t.dtype, torch.float32)).square().mean() for t in tensors)


def _one_batch(model: nn.Module, example_inputs: Any, seed: int, check_grads: bool) -> _StepResult:
    """What one batch compares, as one unlabelled step: eval outputs; with ``check_grads`` the
    loss, every trainable gradient, the parameters after one SGD step and the eval outputs after
    it. Each part says which compiled modules it ran eagerly."""
    parts: dict[str, tuple[str, ...]] = {}

    def part(name: str, run: Callable[[], Any]) -> Any:
        value, eager = _collecting_eager_calls(run)
        if eager:
            parts[name] = eager
        return value

    result: dict[str, Any] = {
        "output": part("output", lambda: _run_eval(model, example_inputs, seed))
    }
    if check_grads:
        with torch.random.fork_rng():
            torch.manual_seed(seed)
            step = part("loss", lambda: _sgd_step(model, example_inputs, _SGD_LR))
        if "loss" in parts:  # the training step's tensors all come from that run
            parts["grad"] = parts["param_after_step"] = parts["loss"]
        result |= {"loss": step["loss"], "grad": step["grad"], "param_after_step": step["param"]}
        result["output_after_step"] = part(
            "output_after_step", lambda: _run_eval(model, example_inputs, seed)
        )
    return _StepResult(label="", value=result, ran_eagerly=parts)


def _sgd_step(model: nn.Module, example_inputs: Any, lr: float) -> dict[str, Any]:
    """A training step, dropout off: the loss, every trainable gradient (``None``: unused), SGD on
    those that have one, and the parameters after it; the model is left in eval mode."""
    _set_mode(model, training=True)
    model.zero_grad(set_to_none=True)
    loss = _loss(_call(model, example_inputs))
    loss.backward()
    trainable = {n: p for n, p in model.named_parameters() if p.requires_grad}
    grads = {n: None if p.grad is None else p.grad.detach().clone() for n, p in trainable.items()}
    torch.optim.SGD([p for p in trainable.values() if p.grad is not None], lr=lr).step()
    model.zero_grad(set_to_none=True)
    _set_mode(model, training=False)
    return {
        "loss": loss.detach(),
        "grad": grads,
        "param": {n: p.detach().clone() for n, p in trainable.items()},
    }


def _run_steps(model: nn.Module, steps: list[EquivalenceStep], seed: int) -> list[_StepResult]:
    _set_mode(model, training=False)
    results = []
    for index, step in enumerate(steps):
        label = f"{index}:{step.name}"
        with torch.random.fork_rng():
            torch.manual_seed(seed + index)  # e.g. add_adapter initialises alike in every copy
            results.append(_run_step(model, label, step.run))
    return results


def _run_step(model: nn.Module, label: str, run: Callable[[nn.Module], Any]) -> _StepResult:
    try:
        value, eager = _collecting_eager_calls(lambda: run(model))
    except Exception as error:  # noqa: BLE001 - reported as a difference
        return _StepResult(label=label, raised=f"{type(error).__name__}: {error}")
    return _StepResult(label=label, value=value, ran_eagerly={"": eager} if eager else {})


def _collecting_eager_calls(run: Callable[[], Any]) -> tuple[Any, tuple[str, ...]]:
    """``run()``, and the compiled modules whose calls it ran eagerly on purpose (each once)."""
    with _RAN_EAGERLY.collecting() as eager:
        value = run()
    return value, tuple(dict.fromkeys(eager))


@dataclass(kw_only=True, frozen=True, slots=True)
class _StepResult:
    label: str
    value: Any = None
    raised: str | None = None
    ran_eagerly: dict[str, tuple[str, ...]] = field(default_factory=dict)
    """Per part of the result (``""``: all of it), the compiled modules whose calls ran eagerly on
    purpose while it was computed (a KV cache)."""


def _reference_run(start: nn.Module, dtype: torch.dtype, run: Callable[[nn.Module], Any]) -> Any:
    """``run`` on a copy of ``start`` at ``dtype``, autocast off, inputs cast."""
    model = copy.deepcopy(start)
    with at_precision(model, dtype), casting_inputs(model, dtype):
        result = run(model)
    raised = next((r for r in result if r.raised), None)
    if raised is not None:  # its later steps would start from another state than eager's
        name = str(dtype).removeprefix("torch.")
        raise ReferenceUnavailable(f"step {raised.label} raised in {name}: {raised.raised[:160]}")
    return result


def _judge(
    eager: list[_StepResult],
    compiled: list[_StepResult],
    exact: list[_StepResult] | None,
    reference: str,
    *,
    tolerance: tuple | None = None,
    noise: dict[str, float] | None = None,
) -> list[TensorDiff]:
    diffs: list[TensorDiff] = []
    for index, (left, right) in enumerate(zip(eager, compiled)):
        if left.raised is None and right.raised is None:
            exact_value = exact[index].value if exact is not None else None
            step_diffs = judge_trees(
                left.label,
                left.value,
                right.value,
                exact_value,
                reference_dtype=reference,
                tolerance=tolerance,
                noise=noise,
            )
        elif (
            left.raised and right.raised and left.raised.split(":")[0] == right.raised.split(":")[0]
        ):
            step_diffs = []  # both raised alike: the step is equivalent (and says so in neither)
        else:
            side, raised = ("compiled", right.raised) if right.raised else ("eager", left.raised)
            step_diffs = [
                TensorDiff(
                    name=left.label,
                    ok=False,
                    ratio=math.inf,
                    max_abs=math.inf,
                    max_rel=math.inf,
                    note=f"only the {side} run raised: {str(raised)[:300]}",
                )
            ]
        for diff in step_diffs:
            diff.step = left.label
        diffs += step_diffs
    return diffs


def _rerun(
    start: nn.Module, compiled: nn.Module, run: Callable[[nn.Module], Any], *, is_steps: bool
) -> Rerun:
    """Both sides again for the noise: eager on a fresh copy of the start and, for one batch, the
    compiled copy from the start's weights (a sequence is not replayed on the compiled copy)."""
    eager_again = run(copy.deepcopy(start))
    said = "noise measured (a tensor failed): eager against eager"
    if is_steps:
        return Rerun(
            eager=eager_again,
            said=said + ", the sequence rerun from the start (a sequence is not replayed on the "
            "compiled copy)",
        )
    try:
        compiled.load_state_dict(start.state_dict())
        again = run(compiled)
    except Exception:  # noqa: BLE001 - the compiled copy cannot be replayed: eager's noise only
        return Rerun(eager=eager_again, said=said + ", rerun from the same start")
    return Rerun(
        eager=eager_again,
        compiled=again,
        said=said + " and compiled against compiled, rerun from the same start",
    )


def _rms(first: list[_StepResult], second: list[_StepResult]) -> dict[str, float]:
    found: dict[str, float] = {}
    for left, right in zip(first, second):
        if left.raised is None and right.raised is None:
            found |= rms_differences(left.label, left.value, right.value)
    return found


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
