"""One trial, in the process the doctor starts for it: ``python -m torchcompile_kit.doctor.trial
REQUEST.json``.

It builds the model from the spec, loads the weights and the batch the doctor saved (so every
trial starts from the same tensors, strides included), checks that eager runs, compiles what the
trial says and judges it against eager with the comparator (``check_compile_equivalence``:
forward, loss, every gradient, one optimizer step). It writes its outcome as JSON, and its stage
to a file first, so a process that dies says how far it got.
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

__all__ = ["call_model", "loss_of", "run_trial"]

_PARTS = (
    ("output_after_step", "step"),
    ("param_after_step", "step"),
    ("update", "step"),
    ("output", "forward"),
    ("loss", "loss"),
    ("grad", "gradients"),
)


def run_trial(request: dict[str, Any]) -> dict[str, Any]:
    """Run the trial ``request`` describes here and return its outcome (a ``TrialOutcome`` dict).

    Example:
        >>> run_trial({"spec": "mypkg:build", "state": "s.pt", "batch": "b.pt",
        ...            "stage": "stage.txt", "trial": {"label": "triage"}})  # doctest: +SKIP
    """
    import torch

    from .. import _dynamo
    from ..bench import load_model_spec
    from ..diagnostics import CompileMonitor, check_compile_equivalence
    from .record import Trial, TrialOutcome

    trial = Trial(**request["trial"])
    stage = Path(request["stage"])
    stage.write_text("eager")
    start = time.perf_counter()
    make_batch = None
    if request.get("spec"):
        spec = load_model_spec(request["spec"])
        model, make_batch = spec.model, spec.make_batch
        model.load_state_dict(torch.load(request["state"], weights_only=True))
    else:  # diagnose(model, batch): the model pickled whole (its class importable here)
        model = torch.load(request["model"], weights_only=False)
    batch = torch.load(request["batch"], weights_only=True)
    torch.manual_seed(request.get("seed", 0))
    outcome = TrialOutcome(**trial.names(), status="ok")
    if trial.rewrite:  # a fix for a graph break: eager must compute what it computed before
        try:
            outcome.rewrite_equal = _rewritten_alike(model, batch, trial.rewrite, trial.autocast)
        except LookupError as err:
            outcome.error = f"the rewrite does not apply: {err}"
            return _done(outcome, start)
    try:
        with _autocast(model, trial.autocast):
            _eager_step(model, batch)
    except Exception as err:  # noqa: BLE001 - the finding: not the compiler
        outcome.status, outcome.error = "eager-error", _first_line(err)
        return _done(outcome, start)
    backend = _backend(trial.backend)
    compiled: list[Any] = []
    compile_fn = _compile_fn(trial, compiled)
    if trial.bisect:
        stage.write_text("compiled")
        outcome.bisect = _bisect(model, batch, backend, trial, compile_fn)
        return _done(outcome, start)
    monitor = CompileMonitor()
    stage.write_text("compiled")
    try:
        with _dynamo.inductor_settings(trial.inductor), _autocast(model, trial.autocast), monitor:
            report = check_compile_equivalence(
                model,
                batch,
                compile_fn=compile_fn,
                backend=backend,
                **trial.compile_kwargs,
            )
            if trial.monitor and compiled and make_batch is not None:  # a second batch
                _second_batch(compiled[0], make_batch, batch)
    except Exception as err:  # noqa: BLE001 - what the compiled run raised is the finding
        compiling = _dynamo.compile_failure_stack(err) is not None
        outcome.status = "compile-error" if compiling else "runtime-error"
        outcome.error = _first_line(err)
    else:
        failures = [d for d in report.diffs if not d.ok]
        if failures:
            outcome.status = "miscompute"
            outcome.differs = sorted(
                {_part(d.name) for d in failures},
                key=["forward", "loss", "gradients", "step"].index,
            )
        outcome.worst = report.worst.explain() if report.worst else None
        outcome.worst_share = report.worst.ratio if report.worst else None
        outcome.reference = report.reference.describe()
    if trial.monitor and outcome.status == "ok" and compiled and not trial.rewrite:
        outcome.pays = _pays(model, compiled[0], batch, monitor.snapshot()["compile_seconds"])
    if trial.monitor:
        record = monitor.snapshot()
        outcome.graphs = record["graphs"]
        outcome.graph_breaks = [
            {
                "location": b.location,
                "file": b.file,
                "line": b.line,
                "reason": b.reason,
                "in_torch": b.in_torch,
                "fix": b.hints[0] if b.hints else None,
            }
            for b in monitor.graph_breaks
        ]
        outcome.recompiles = [r.guard for r in monitor.recompiles]
        outcome.limit_hits = len(monitor.limit_hits)
    return _done(outcome, start)


def _bisect(model: Any, batch: Any, backend: Any, trial: Any, compile_fn: Any) -> Any:
    """torch's bisection over repeated comparisons (each compiles afresh, as it needs)."""
    import torch

    from .. import _dynamo
    from ..diagnostics import check_compile_equivalence

    def good() -> bool:
        torch.compiler.reset()
        try:
            with _dynamo.inductor_settings(trial.inductor), _autocast(model, trial.autocast):
                return check_compile_equivalence(
                    model,
                    batch,
                    compile_fn=compile_fn,
                    backend=backend,
                    **trial.compile_kwargs,
                ).ok
        except Exception:  # noqa: BLE001 - a compile or run that raises is a bad run
            return False

    return _dynamo.compiler_bisect(good)


def _autocast(model: Any, dtype: str | None) -> Any:
    """``torch.autocast`` on the model's device with ``dtype``, or nothing."""
    import contextlib

    import torch

    if dtype is None:
        return contextlib.nullcontext()
    device = next((p.device.type for p in model.parameters()), "cpu")
    return torch.autocast(device, dtype=getattr(torch, dtype))


def _done(outcome: Any, start: float) -> dict[str, Any]:
    outcome.seconds = round(time.perf_counter() - start, 3)
    return outcome.as_dict()


def _first_line(err: BaseException) -> str:
    message = next((line.strip() for line in str(err).splitlines() if line.strip()), "")
    return f"{type(err).__name__}: {message[:300]}"


def _part(name: str) -> str:
    return next((part for prefix, part in _PARTS if name.startswith(prefix)), "forward")


def call_model(model: Any, batch: Any) -> Any:
    """``model(**batch)``, ``model(*batch)`` or ``model(batch)``, as the batch is given."""
    if isinstance(batch, dict):
        return model(**batch)
    return model(*batch) if isinstance(batch, (tuple, list)) else model(batch)


def loss_of(output: Any) -> Any:
    """The loss of a model's output: its ``loss`` key or attribute, else its floating-point
    tensors summed.

    Example:
        >>> import torch
        >>> loss_of(torch.ones(2, 3))
        tensor(6.)
    """
    import torch

    loss = output.get("loss") if isinstance(output, dict) else getattr(output, "loss", None)
    if isinstance(loss, torch.Tensor):
        return loss
    if isinstance(output, torch.Tensor):
        return output.float().sum()
    values = output.values() if isinstance(output, dict) else output
    tensors = [t for t in values if isinstance(t, torch.Tensor) and t.is_floating_point()]
    if not tensors:
        raise TypeError(
            f"the model returned {type(output).__name__} with no loss and no "
            "floating-point tensor to sum"
        )
    return sum(t.float().sum() for t in tensors)


def _rewritten_alike(model: Any, batch: Any, rewrite: dict[str, Any], autocast: Any) -> bool:
    """Apply ``rewrite`` to the model's class (:func:`~.fixes.apply_rewrite`) and say whether
    eager's loss and gradients on the batch are what they were before it (within 1e-5)."""
    import torch

    from .fixes import apply_rewrite

    def step() -> list[Any]:
        torch.manual_seed(0)
        with _autocast(model, autocast):
            return _eager_step(model, batch)

    before = step()
    apply_rewrite(model, rewrite)
    after = step()
    return len(before) == len(after) and all(
        torch.allclose(a.float(), b.float(), rtol=1e-5, atol=1e-8) for a, b in zip(before, after)
    )


def _eager_step(model: Any, batch: Any) -> list[Any]:
    """Forward and backward eagerly on a copy (a model that fails here is not the compiler's):
    the loss and every gradient."""
    import copy

    probe = copy.deepcopy(model)
    loss = loss_of(call_model(probe, batch))
    loss.backward()
    return [loss.detach(), *(p.grad for p in probe.parameters() if p.grad is not None)]


def _backend(name: str) -> Any:
    """A backend name as ``torch.compile`` takes it, or the callable ``module:attribute`` names."""
    if ":" not in name:
        return name
    from .._factory import import_factory

    return import_factory(name, flag="--backend")


def _compile_fn(trial: Any, compiled: list[Any]) -> Callable[..., Any]:
    """How the trial compiles the copy: the whole model (by the library's recipe, if the trial
    names one), only some modules, or the whole model with some left eager
    (``torch.compiler.disable`` on their ``forward``)."""
    import torch

    from ..regional import compile_in_place

    def compile_fn(model: Any, **compile_kwargs: Any) -> Any:
        if trial.modules is not None:
            modules = [model.get_submodule(path) for path in trial.modules]
            compile_in_place(modules, **compile_kwargs)
        elif trial.recipe and not trial.exclude:
            # verify=False: the comparator judges, not the recipe's own first-call check
            _recipe(trial.recipe)(model, verify=False, **compile_kwargs)
        else:
            for path in trial.exclude:
                module = model.get_submodule(path)
                module.forward = torch.compiler.disable(module.forward, recursive=True)
            model.compile(**compile_kwargs)
        compiled.append(model)
        return model

    return compile_fn


def _recipe(name: str) -> Callable[..., Any]:
    if name == "peft":
        from ..adapters import compile_peft

        return compile_peft
    from ..regional import compile_model, compile_regional

    return {"regional": compile_regional, "model": compile_model}[name]


def _second_batch(model: Any, make_batch: Callable[[int], Any], first: Any) -> None:
    """A forward and backward on the builder's next batch when it differs from the first in a
    shape or in a Python value (what a guard can hold: a token count, a flag)."""
    second = make_batch(1)
    if _guarded(second) != _guarded(first):
        model.train()
        loss_of(call_model(model, second)).backward()


def _guarded(batch: Any) -> list[Any]:
    """What dynamo guards on in a batch: each tensor's shape, each other value as it is."""
    import torch

    parts = batch.values() if isinstance(batch, dict) else batch
    parts = [parts] if isinstance(parts, torch.Tensor) else list(parts)
    return [tuple(p.shape) if isinstance(p, torch.Tensor) else p for p in parts]


def _pays(
    eager: Any, compiled: Any, batch: Any, compile_s: float, blocks: int = 12
) -> dict[str, Any]:
    """Eager and compiled forward and backward stepped in alternation on the batch (as the bench
    pairs its rows), their median step times, the ratio with its interval, and the steps after
    which the compile seconds are paid back."""
    from ..bench import ratio_interval, speedup_unquotable

    def step(model: Any) -> float:
        model.zero_grad(set_to_none=True)
        begin = time.perf_counter()
        loss_of(call_model(model, batch)).backward()
        return time.perf_counter() - begin

    for model in (eager, compiled):
        model.train()
        step(model)  # warm: the compiled side's graphs exist already; caches, allocator
    eager_s, compiled_s = [], []
    for _ in range(blocks):
        eager_s.append(step(eager))
        compiled_s.append(step(compiled))
    ratio = ratio_interval(eager_s, compiled_s)
    saved = sorted(eager_s)[blocks // 2] - sorted(compiled_s)[blocks // 2]
    unquotable = speedup_unquotable(ratio)  # the bench's rule: no payback from a guess
    faster = not unquotable and ratio.low is not None and ratio.low > 1 and saved > 0
    return {
        "eager_step_s": sorted(eager_s)[blocks // 2],
        "compiled_step_s": sorted(compiled_s)[blocks // 2],
        "speedup": ratio.ratio,
        "low": ratio.low,
        "high": ratio.high,
        "compile_s": round(compile_s, 3),
        "payback_steps": round(compile_s / saved) if faster else None,
        "unquotable": unquotable,
    }


def main(argv: list[str] | None = None) -> int:
    """Run the trial of ``argv[0]`` (a request JSON) and write its outcome to ``request["out"]``."""
    request = json.loads(Path((argv or sys.argv[1:])[0]).read_text())
    outcome = run_trial(request)
    Path(request["out"]).write_text(json.dumps(outcome))
    return 0


if __name__ == "__main__":
    sys.exit(main())
