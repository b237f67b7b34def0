"""Running candidates through the bench's runner with a time limit (the budget left, or when they
can no longer win) and the correctness check in their own process (:mod:`.gate`).
"""

from __future__ import annotations

import dataclasses
import logging
import statistics
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..bench import MeasureConfig, Recipe, RunRequest, missing_requirement, run_recipe_isolated
from .arithmetic import predicted_total
from .budget import Budget
from .gate import CHECK_HOOK
from .ranking import cost_of
from .result import CandidateResult, PredictionCheck, Steadiness

__all__ = ["OVERRIDES", "RunPlan", "measure_candidate", "run_planned", "run_steadiness"]

# tune lets graph breaks happen (and counts them) instead of failing on them: fullgraph=True is
# written into the snippet only when the measured run had none
OVERRIDES = {"fullgraph": False}
_NO_LIMIT_S = 7 * 24 * 3600.0  # a longer time limit is no limit (and overflows select())
_log = logging.getLogger("torchcompile_kit.tuning")  # progress: a line per candidate and check


@dataclass(kw_only=True, slots=True, frozen=True)
class RunPlan:
    """What every candidate's run of one ``tune`` shares."""

    spec: str | None
    """The ``--model`` spec (``None``: the captioner)."""
    measure: MeasureConfig
    """How each run is measured (backend, preset, steps, steady seconds, paired)."""
    device_type: str
    """``"cpu"`` or ``"cuda"``: decides which recipes can run here."""
    steps_planned: int
    """The planned run (for pruning, and the cap of the steady steps)."""
    warm_start: bool
    """Warm restarts count for the planned run."""
    runs: Path
    """The runner's ``out_dir`` (a temporary directory)."""


def measure_candidate(
    candidate: Recipe,
    plan: RunPlan,
    budget: Budget,
    done: list[CandidateResult],
) -> CandidateResult:
    """Run one candidate in its own process (or say why not), checked against eager at the end of
    its run, and append its result to ``done`` (``ok``, ``failed``, ``skipped`` or ``pruned``;
    ``metrics.stopped`` says how far a run the budget stopped had got)."""
    result = CandidateResult(
        name=candidate.name,
        description=candidate.description,
        status="skipped",
        restart=candidate.cache_from is not None,
        verdict="eager" if candidate.compile == "none" else "unchecked",
    )
    done.append(result)
    result.reason = _cannot_run(candidate, plan, done)
    eager = next((r for r in done if r.name == "eager" and r.status == "ok"), None)
    floor = eager.wall_s if eager is not None else 0.0
    if result.reason is None and budget.left() <= floor:
        result.reason = (
            f"budget: {max(budget.left(), 0):.0f} s left, and one run takes at least "
            f"~{floor:.0f} s here (eager's run)"
        )
    if result.reason is not None:
        _log.info("candidate %s: skipped - %s", candidate.name, result.reason)
        return result
    timeout, bound = budget.left(), None
    best = _best_so_far(done, plan.steps_planned, plan.warm_start)
    if candidate.compile != "none" and best is not None and eager is not None:
        measured = (eager.metrics.warmup_s or 0.0) + sum(eager.metrics.step_times_s)
        startup = max(0.0, eager.wall_s - measured)  # process start, imports, model build
        bound = startup + best[1] + floor
        timeout = min(timeout, bound)
    _log.info("candidate %s: running", candidate.name)
    result.started_s = budget.elapsed()
    progress = _Progress()
    compiled = candidate.compile != "none"
    request = RunRequest(
        recipe=candidate.name,
        spec=plan.spec,
        config=plan.measure,
        compile_overrides=OVERRIDES if compiled else {},
        plan_steps=plan.steps_planned,
        check=CHECK_HOOK if compiled else None,
        # every candidate's ratio is to eager (pad to max), the table's "x eager"
        # (a background compile's steps change speed at its switch: timed alone)
        pair_with="eager"
        if plan.measure.paired
        and candidate.name != "eager"
        and "background" not in candidate.compile_kwargs
        else None,
    )
    run = run_recipe_isolated(
        request,
        out_dir=plan.runs,
        timeout_s=None if timeout > _NO_LIMIT_S else timeout,
        on_event=progress,
    )
    result.status, result.wall_s, result.metrics = run.status, run.wall_s, run.metrics
    result.reason = run.reason or run.error
    if run.status == "failed" and run.stopped_after_s is not None:
        if bound is not None and timeout == bound:
            result.status = "pruned"
            result.reason = (
                f"cannot win: not done after {timeout:.0f} s, when {best[0]} is predicted to "
                f"finish all {plan.steps_planned:,} steps in {best[1]:.0f} s"
            )
        else:
            result.status = "skipped"
            result.reason = f"budget: stopped after {timeout:.0f} s when the budget ran out"
            result.metrics.stopped = progress.stopped(timeout)
    _log.info(
        "candidate %s: %s%s",
        candidate.name,
        result.status,
        f" - {result.reason}" if result.reason else "",
    )
    if result.status == "ok" and candidate.compile != "none":
        _read_check(result)
    return result


class _Progress:
    """The run's progress events (phase, steps), kept to say how far a stopped run got."""

    def __init__(self) -> None:
        self.began = time.perf_counter()
        self.phase: str | None = None
        self.steady_after_s: float | None = None

    def __call__(self, event: dict[str, Any]) -> None:
        if event.get("event") in ("phase", "step"):
            self.phase = event.get("phase") or self.phase
        if self.phase == "steady" and self.steady_after_s is None:
            self.steady_after_s = time.perf_counter() - self.began  # warm-up (compile) done

    def stopped(self, after_s: float) -> dict[str, Any]:
        return {"after_s": after_s, "phase": self.phase, "steady_after_s": self.steady_after_s}


def _read_check(result: CandidateResult) -> None:
    """The verdict of the check the candidate's own run made (``metrics.check``)."""
    check = result.metrics.check
    if not isinstance(check, dict) or "ok" not in check:
        result.reason = "not checked: its run reported no correctness check"
        return
    result.verdict = "pass" if check["ok"] else "fail"
    result.offending = check.get("offending")
    result.gate_s = check.get("seconds")
    result.gate_new_graphs = check.get("new_graphs")
    _log.info("check %s: %s", result.name, result.verdict)


def _cannot_run(candidate: Recipe, plan: RunPlan, done: list[CandidateResult]) -> str | None:
    if candidate.compile == "none" and candidate.data != "max" and plan.spec is not None:
        return (
            "same batches as 'eager' for a --model spec (it differs only in the captioner's "
            "padding)"
        )
    # found here, not in a process started to find it: a start-up saved from the budget
    missing = missing_requirement(
        candidate, device_type=plan.device_type, spec=plan.spec, backend=plan.measure.backend
    )
    if missing is not None:
        return missing
    source = candidate.cache_from
    if source is not None and not any(r.name == source and r.status == "ok" for r in done):
        return f"needs the compile cache of {source!r}, which did not run"
    return None


def _best_so_far(
    done: list[CandidateResult], steps_planned: int, warm_start: bool
) -> tuple[str, float] | None:
    """(name, predicted total) of the cheapest measured candidate so far (before any check)."""
    best = None
    for result in done:
        if result.status != "ok" or (result.restart and not warm_start):
            continue
        total = predicted_total(cost_of(result), steps_planned)
        if best is None or total < best[1]:
            best = (result.name, total)
    return best


def run_planned(chosen: CandidateResult, candidate: Recipe, plan: RunPlan) -> PredictionCheck:
    """Run the recommendation for the planned steps, against what was predicted."""
    warmup = chosen.metrics.warmup_steps or 1
    config = dataclasses.replace(
        plan.measure, steps=max(1, plan.steps_planned - warmup), warmup_steps=warmup, steady_s=0.0
    )
    request = RunRequest(
        recipe=candidate.name,
        spec=plan.spec,
        config=config,
        compile_overrides=OVERRIDES if candidate.compile != "none" else {},
    )
    run = run_recipe_isolated(request, out_dir=plan.runs)
    if run.status != "ok":
        return PredictionCheck(status=run.status, error=run.error or run.reason)
    times = run.metrics.step_times_s
    measured = float(run.metrics.warmup_s) + (run.metrics.cache.load_s or 0.0) + sum(times)
    return PredictionCheck(
        status="ok",
        recipe=chosen.name,
        steps=plan.steps_planned,
        predicted_s=chosen.predicted_total_s,
        measured_s=measured,
        ratio=chosen.predicted_total_s / measured if measured else None,
        predicted_step_ms=1e3 * chosen.step_s if chosen.step_s is not None else None,
        cpu_steal=run.metrics.cpu_steal,
        steadiness=run_steadiness(times),
    )


def run_steadiness(
    step_times_s: list[float], *, windows: int = 20, limit: float = 1.5
) -> Steadiness | None:
    """Whether a long run kept one speed: its steps cut into ``windows`` spans, the slowest span's
    median step at most ``limit`` times the median span's (the same batches come back in every span,
    so a slow span means the machine changed); ``None`` for runs too short to cut.

    Example:
        >>> run_steadiness([0.01] * 100 + [0.05] * 10,  # doctest: +NORMALIZE_WHITESPACE
        ...     windows=10).steady
        False
    """
    if len(step_times_s) < 10 * windows:
        return None
    size = len(step_times_s) // windows
    # medians: a few recompile spikes (part of the prediction) do not make a span slow
    medians = [
        1e3 * statistics.median(step_times_s[i * size : (i + 1) * size]) for i in range(windows)
    ]
    typical = sorted(medians)[len(medians) // 2]
    fastest, slowest = min(medians), max(medians)
    steady = slowest <= limit * typical
    note = (
        f"the run kept its speed: {windows} spans of {size} steps, median steps {fastest:.1f} to "
        f"{slowest:.1f} ms"
        if steady
        else f"the run did not keep one speed: in {windows} spans of {size} steps the median step "
        f"went from {fastest:.1f} to {slowest:.1f} ms (typical {typical:.1f}); the machine's "
        "speed changed during it, so its total does not test the prediction: re-run on a quiet "
        "machine"
    )
    return Steadiness(steady=steady, window_ms=[round(m, 2) for m in medians], note=note)
