"""The correctness gate: a candidate that computes something else than eager is never recommended.
It runs in the candidate's process on the model that run compiled (:data:`CHECK_HOOK`;
docs/tune.md, "The correctness gate").
"""

from __future__ import annotations

import copy
import time
from dataclasses import asdict, dataclass
from typing import Any

from ..adapters import check_peft_compile_safety
from ..bench import RECIPES, Recipe, RecipeContext, loss_of
from ..diagnostics import (
    CompileMonitor,
    EquivalenceStep,
    Sides,
    check_compile_equivalence,
    compare,
    judge_tensors,
    reference_dtype,
)

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
    """The run's compiled optimizer against an eager one of its class from the same state and
    gradients, by the one comparison procedure (:func:`~torchcompile_kit.diagnostics.compare`):
    a third one stepping copies at the reference precision is the reference, when a parameter is
    not rounding-level near eager's."""
    model.train()
    model.zero_grad(set_to_none=True)
    loss_of(model(**batch)).backward()
    params = [p for group in optimizer.param_groups for p in group["params"]]
    starts = [p.detach().clone() for p in params]
    saved = copy.deepcopy(optimizer.state_dict())  # plain floats: a torch optimizer loads it

    def eager_copy(dtype: Any) -> list[Any]:
        clones = []
        for param, start in zip(params, starts):
            clone = start.to(dtype or param.dtype, copy=True).requires_grad_(param.requires_grad)
            clone.grad = (
                None if param.grad is None else param.grad.detach().to(clone.dtype, copy=True)
            )
            clones.append(clone)
        groups = [
            {
                **{k: v for k, v in group.items() if k != "params"},
                "params": [clones[i] for i in group["params"]],
            }
            for group in saved["param_groups"]
        ]
        stepping = type(optimizer)(groups)
        stepping.load_state_dict(saved)  # the state takes each clone's dtype
        for _ in range(_OPTIMIZER_STEPS):
            stepping.step()
        return clones

    eager = eager_copy(None)
    for _ in range(_OPTIMIZER_STEPS):
        optimizer.step()
    by_id = {id(p): n for n, p in model.named_parameters()}
    names = [f"param_after_compiled_optimizer_step.{by_id.get(id(p), '?')}" for p in params]
    judged = compare(
        Sides(
            eager=eager,
            compiled=params,
            reference=eager_copy,
            precision=reference_dtype(starts),
            judge=lambda eager, compiled, exact, _name, **_: judge_tensors(
                names, eager, compiled, exact
            ),
            subject="the optimizer",
        )
    )
    if judged.failures:
        verdict.ok = False
        verdict.offending = max(judged.failures, key=lambda d: d.ratio).explain()  # the worst
    verdict.summary += (
        f"\ncompile_optimizer({type(optimizer).__name__}): {_OPTIMIZER_STEPS} "
        "steps of the run's compiled optimizer compared with an eager "
        f"{type(optimizer).__name__} from the same state (reference: "
        f"{judged.describe_reference()})"
    )
    return verdict
