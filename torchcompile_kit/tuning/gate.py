"""The correctness gate: a candidate that computes something else than eager is never recommended.
It runs in the candidate's process on the model that run compiled (:data:`CHECK_HOOK`;
docs/tune.md, "The correctness gate").
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass
from typing import Any

from ..adapters import check_peft_compile_safety
from ..bench import RECIPES, Recipe, RecipeContext, loss_of
from ..diagnostics import (
    CompileMonitor,
    EquivalenceStep,
    check_compile_equivalence,
    first_call_checks_made,
)
from ..errors import CompiledMismatchError
from ..optim import verify_next_step

__all__ = ["CHECK_HOOK", "GateVerdict", "check_candidate", "check_in_run"]

CHECK_HOOK = f"{__name__}:check_in_run"
"""What ``tune`` passes as the bench runner's ``check=``: :func:`check_in_run`, by name, since
it runs in the candidate's process."""
_OPTIMIZER_STEPS = 2


@dataclass(kw_only=True, slots=True)
class GateVerdict:
    """The outcome of the correctness gate for one candidate's run."""

    ok: bool
    """No compared tensor was judged wrong by the comparator (and no PEFT refusal fired)."""
    offending: str | None = None
    """The first failing tensor, with how far off it is, or the error that stopped the check."""
    summary: str = ""
    """What was compared, in a few lines."""
    new_graphs: int | None = None
    """Graphs the check compiled on top of the run's (``CompileMonitor``): 0 when it reused
    the run's compiled code throughout."""
    seconds: float = 0.0
    """Wall seconds the check took."""

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready fields (what the candidate's process reports)."""
        return asdict(self)


def check_candidate(
    candidate: Recipe,
    *,
    model: Any,
    reference: Any,
    batch: dict[str, Any],
    optimizer: Any,
    backend: str,
    overrides: dict[str, Any] | None = None,
) -> GateVerdict:
    """Check a run's compiled model (and compiled optimizer) against eager, compiling nothing new.

    ``model`` is the model the run compiled and trained (its weights are set to ``reference``'s, the
    weights the run started from); ``batch`` has a shape the run compiled. Exceptions while checking
    become a failed :class:`GateVerdict`.

    Example:
        >>> verdict = check_candidate(RECIPES["full"], model=compiled, reference=eager_copy,
        ...                           batch=batch, optimizer=opt, backend="eager")  # doctest: +SKIP
        >>> verdict.ok, verdict.offending, verdict.new_graphs  # doctest: +SKIP
        (True, None, 0)
    """
    started = time.perf_counter()
    monitor = CompileMonitor()
    try:
        verdict = _peft_refusal(reference, backend, overrides or {})
        if verdict is None:
            with monitor:
                verdict = _equivalence(model, reference, batch, backend)
                if verdict.ok and candidate.optimizer in ("compiled", "foreach_map"):
                    verdict = _optimizer(model, optimizer, batch, verdict)
            verdict.new_graphs = monitor.snapshot().get("graphs")
    except Exception as err:  # noqa: BLE001 - a candidate that cannot be checked is not recommended
        verdict = GateVerdict(ok=False, offending=f"{type(err).__name__}: {err}"[:500])
    verdict.seconds = time.perf_counter() - started
    return verdict


def check_in_run(
    ctx: RecipeContext, *, reference: Any, batch: dict[str, Any], recipe: str
) -> dict[str, Any]:
    """The bench runner's ``check=`` hook: :func:`check_candidate` in the candidate's process, on
    the run's first batch; returns :meth:`GateVerdict.as_dict` (stored as ``metrics.check``)."""
    verdict = check_candidate(
        RECIPES[recipe],
        model=ctx.model,
        reference=reference,
        batch=batch,
        optimizer=ctx.optimizer,
        backend=ctx.backend,
        overrides=ctx.overrides,
    )
    return verdict.as_dict()


def _peft_refusal(model: Any, backend: str, overrides: dict[str, Any]) -> GateVerdict | None:
    if not hasattr(model, "peft_config"):
        return None
    findings = check_peft_compile_safety(
        model,
        fullgraph=bool(overrides.get("fullgraph", False)),
        training=True,
        backend=backend,
        on_violation="ignore",
    )
    refusals = [f for f in findings if f.severity == "refuse"]
    if not refusals:
        return None
    return GateVerdict(
        ok=False, offending=str(refusals[0]), summary="check_peft_compile_safety refused"
    )


def _equivalence(model: Any, reference: Any, batch: dict[str, Any], backend: str) -> GateVerdict:
    def the_runs_model(start: Any, **_: Any) -> Any:
        # check_compile_equivalence hands over its copy of the reference (perturbed the same way
        # as the eager side, for PEFT): the run's compiled model takes its weights, nothing compiles
        model.load_state_dict(start.state_dict())
        return model

    steps = [
        EquivalenceStep.train(batch, name="train"),
        EquivalenceStep.train(batch, name="train after the step"),
    ]
    report = check_compile_equivalence(
        reference, steps=steps, backend=backend, compile_fn=the_runs_model
    )
    offending = None
    if report.failures:
        offending = max(report.failures, key=lambda d: d.ratio).explain()
    return GateVerdict(ok=report.ok, offending=offending, summary=report.summary())


def _optimizer(
    model: Any, optimizer: Any, batch: dict[str, Any], verdict: GateVerdict
) -> GateVerdict:
    """The run's compiled optimizer, each of its next steps checked against an eager step from
    the same state and gradients by ``compile_optimizer``'s own check
    (:func:`~torchcompile_kit.optim.verify_next_step`)."""
    model.train()
    model.zero_grad(set_to_none=True)
    loss_of(model(**batch)).backward()
    name = type(optimizer).__name__
    with first_call_checks_made() as checked:
        try:
            for _ in range(_OPTIMIZER_STEPS):
                verify_next_step(optimizer)
                optimizer.step()
        except CompiledMismatchError as error:
            verdict.ok = False
            worst = error.record
            verdict.offending = (
                f"{worst.worst}: {worst.worst_ratio:.3g} times its allowance (reference: "
                f"{worst.reference})"
            )
    record = checked[-1] if checked else None
    verdict.summary += (
        f"\ncompile_optimizer({name}): {_OPTIMIZER_STEPS} steps of the run's compiled optimizer, "
        f"each compared with an eager {name} step from the same state (reference: "
        f"{record.reference if record is not None else 'none'})"
    )
    return verdict
