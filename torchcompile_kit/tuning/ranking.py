"""Ranking: the arithmetic applied to the measured candidates. A paired candidate's step is eager's
÷ its paired ratio; overlapping predicted-total intervals are *indistinguishable* (docs/tune.md).
"""

from __future__ import annotations

import math

from ..bench import Speedup, paired_ratio
from .arithmetic import Cost, break_even_steps, cost_from_metrics, predicted_total
from .result import CandidateResult

__all__ = ["cost_of", "rank_candidates"]


def cost_of(result: CandidateResult) -> Cost:
    """The cost model of a measured candidate, from the bench runner's metrics."""
    metrics = result.metrics
    # a warm restart loads its cache before the first step: part of what the restart costs
    return cost_from_metrics(
        warmup_s=float(metrics.warmup_s) + (metrics.cache.load_s or 0.0),
        warmup_steps=metrics.warmup_steps or 0,
        step_s=1.0 / float(metrics.steps_per_s),
        step_times_s=metrics.step_times_s,
        recompiles=metrics.recompiles,
        step_tokens=metrics.step_tokens,
        plan_tokens=metrics.plan_tokens_per_step,
    )


def _background_cost(result: CandidateResult, eager: Cost, compiled: Cost | None) -> Cost:
    """A background candidate: eager steps while its worker compiled, the stall at the switch,
    then the compiled recipe's steps (``compiled``: the same graphs' measured candidate, if any)."""
    record = result.metrics.background
    if record is None or record.stall_s is None or record.worker_s is None:
        state = record.state if record is not None else "no record"
        raise ValueError(f"its background compile did not switch ({state})")
    if compiled is None:  # its own compiled steps, after the switching one
        after = result.metrics.step_times_s[-max(1, len(result.metrics.step_times_s) // 4) :]
        compiled = Cost(compile_s=0.0, recompile_s=0.0, step_s=sorted(after)[len(after) // 2])
    return Cost(
        compile_s=max(0.0, record.stall_s - compiled.step_s),
        recompile_s=0.0,
        # eager until the worker started (start_after_s in) and was seen done
        step_s=compiled.step_s,
        eager_steps=((record.start_after_s or 0.0) + record.worker_s) / eager.step_s,
        eager_step_s=eager.step_s,
    )


def _costs(results: list[CandidateResult], steps_planned: int) -> None:
    """Fill compile/step seconds, totals, speedups and break-evens of the measured candidates."""
    eager = next((r for r in results if r.name == "eager" and r.status == "ok"), None)
    eager_cost = cost_of(eager) if eager is not None else None
    for result in results:
        if result.status != "ok":
            continue
        try:
            if result.metrics.background is not None and eager_cost is not None:
                same = next(
                    (
                        r
                        for r in results
                        if r.name == result.name.removesuffix("-background")
                        and r.status == "ok"
                        and r.step_s
                    ),
                    None,
                )
                cost = _background_cost(
                    result,
                    eager_cost,
                    None
                    if same is None
                    else Cost(compile_s=0.0, recompile_s=0.0, step_s=same.step_s),
                )
            else:
                cost = cost_of(result)
        except (KeyError, TypeError, ValueError, ZeroDivisionError) as err:
            result.status, result.reason = "failed", f"no timing in the run's metrics ({err!r})"
            continue
        ratio = (
            paired_ratio(result.metrics)
            if eager_cost is not None and cost.eager_steps is None
            else None
        )
        slow = fast = None
        if ratio is not None:
            # the planned run's tokens against the timed steps', as the run's own line says
            scale = cost.step_s / cost.measured_step_s if cost.measured_step_s else 1.0
            cost.step_s = eager_cost.step_s * scale / ratio.ratio
            if ratio.low is not None:
                slow = eager_cost.step_s * scale / ratio.low
                fast = eager_cost.step_s * scale / ratio.high
        result.compile_s, result.recompile_s, result.step_s = (
            cost.compile_s,
            cost.recompile_s,
            cost.step_s,
        )
        result.measured_step_s = cost.measured_step_s
        result.predicted_total_s = predicted_total(cost, steps_planned)
        if fast is not None:
            result.predicted_total_low_s = cost.overhead_s + steps_planned * fast
            result.predicted_total_high_s = cost.overhead_s + steps_planned * slow
        if eager_cost is not None:
            result.speedup = Speedup(
                ratio=eager_cost.step_s / cost.step_s,
                low=eager_cost.step_s / slow if slow is not None else None,
                high=eager_cost.step_s / fast if fast is not None else None,
                paired=ratio is not None,
                baseline="eager",
            )
            result.break_even_steps = break_even_steps(cost, eager_cost)
    _mark_indistinguishable(
        [r for r in results if r.status == "ok" and r.predicted_total_s is not None]
    )


def _total_interval(result: CandidateResult) -> tuple[float, float]:
    """The predicted total's interval; a point for eager (the scale) and unpaired candidates."""
    if result.predicted_total_low_s is None:
        return result.predicted_total_s, result.predicted_total_s
    return result.predicted_total_low_s, result.predicted_total_high_s


def _mark_indistinguishable(measured: list[CandidateResult]) -> None:
    """Each candidate's ``indistinguishable_from``: the others whose total intervals overlap it."""
    for result in measured:
        low, high = _total_interval(result)
        result.indistinguishable_from = [
            other.name
            for other in measured
            if other is not result
            and (result.paired or other.paired)
            and _total_interval(other)[0] <= high
            and low <= _total_interval(other)[1]
        ]


def rank_candidates(
    results: list[CandidateResult], steps_planned: int, *, warm_start: bool = False
) -> tuple[list[CandidateResult], CandidateResult | None]:
    """Fill each measured candidate's costs, predicted total, speedup and break-even, and rank them:
    eligible ones (measured, and correct or eager) by predicted total, then measured ones, then the
    rest in run order. Returns ``(ranked, recommended)`` (``None`` when nothing is eligible); warm
    restarts may be recommended only with ``warm_start``."""
    _costs(results, steps_planned)
    measured = sorted(
        (r for r in results if r.status == "ok"),
        key=lambda r: (
            not r.eligible,
            r.restart and not warm_start,
            r.predicted_total_s or math.inf,
        ),
    )
    ranked = measured + [r for r in results if r.status != "ok"]
    eligible = [r for r in ranked if r.eligible and (warm_start or not r.restart)]
    return ranked, (eligible[0] if eligible else None)
