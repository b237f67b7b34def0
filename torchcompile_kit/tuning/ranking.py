"""Ranking: the arithmetic applied to the measured candidates, and the recommendation."""

from __future__ import annotations

import math

from .arithmetic import Cost, break_even_steps, cost_from_metrics, predicted_total
from .result import CandidateResult

__all__ = ["cost_of", "rank_candidates"]


def cost_of(result: CandidateResult) -> Cost:
    """The cost model of a measured candidate, from the bench runner's metrics."""
    metrics = result.metrics
    warmup_steps = int(metrics.get("warmup_steps") or 0)
    # a warm restart loads its cache before the first step: part of what the restart costs
    warmup_s = float(metrics["warmup_s"]) + float(metrics.get("cache_load_s") or 0.0)
    return cost_from_metrics(
        warmup_s=warmup_s,
        warmup_steps=warmup_steps,
        step_s=1.0 / float(metrics["steps_per_s"]),
        step_times_s=metrics.get("step_times_s") or (),
        recompiles=_measured_recompiles(metrics),
        step_tokens=metrics.get("step_tokens") or (),
        plan_tokens=metrics.get("plan_tokens_per_step"),
    )


def _measured_recompiles(metrics: dict) -> int | None:
    """Recompiles the monitor counted in the candidate's run, or ``None`` where none was kept."""
    value = metrics.get("recompiles")
    return int(value) if isinstance(value, (int, float)) else None


def _costs(results: list[CandidateResult], steps_planned: int) -> None:
    """Fill compile/step seconds, totals, speedups and break-evens of the measured candidates."""
    eager = next((r for r in results if r.name == "eager" and r.status == "ok"), None)
    eager_cost = cost_of(eager) if eager is not None else None
    for result in results:
        if result.status != "ok":
            continue
        try:
            cost = cost_of(result)
        except (KeyError, TypeError, ValueError, ZeroDivisionError) as err:
            result.status, result.reason = "failed", f"no timing in the run's metrics ({err!r})"
            continue
        result.compile_s, result.recompile_s, result.step_s = (
            cost.compile_s,
            cost.recompile_s,
            cost.step_s,
        )
        result.measured_step_s = cost.measured_step_s
        result.predicted_total_s = predicted_total(cost, steps_planned)
        if eager_cost is not None:
            result.speedup = eager_cost.step_s / cost.step_s
            result.break_even_steps = break_even_steps(cost, eager_cost)


def rank_candidates(
    results: list[CandidateResult], steps_planned: int, *, warm_start: bool = False
) -> tuple[list[CandidateResult], CandidateResult | None]:
    """The arithmetic for a run of ``steps_planned`` steps: ranking and recommendation.

    Fills each measured candidate's costs, predicted total, speedup and break-even against
    ``eager`` from its metrics, then ranks: eligible candidates (measured, and correct or eager)
    by predicted total, then measured ones that are not eligible, then the rest in run order.

    Args:
        results: the candidates (``status``, ``verdict`` and the runner's ``metrics`` set).
        steps_planned: the planned run length.
        warm_start: warm restarts may be recommended (a saved compile cache exists).

    Returns:
        ``(ranked, recommended)``; ``recommended`` is ``None`` when no candidate is eligible.

    Example:
        >>> ranked, best = rank_candidates(results, 5000)  # doctest: +SKIP
    """
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
