"""The budget of one ``tune``: time left, and, when it ran out, what budget would have done more
(:func:`budget_shortfall`, from what was measured before it ran out).
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field

from .result import CandidateResult

__all__ = ["Budget", "budget_shortfall"]


@dataclass(kw_only=True, slots=True)
class Budget:
    """The wall seconds ``tune`` may spend, counted from its creation."""

    budget_s: float | None
    """The budget; ``None``: no limit."""
    started: float = field(default_factory=lambda: time.perf_counter())
    """``time.perf_counter()`` when ``tune`` started."""

    def elapsed(self) -> float:
        """Seconds since ``tune`` started."""
        return time.perf_counter() - self.started

    def left(self) -> float:
        """Seconds left (``inf`` without a budget; negative once overrun)."""
        return math.inf if self.budget_s is None else self.budget_s - self.elapsed()


def budget_shortfall(results: list[CandidateResult], budget: Budget) -> str | None:
    """A sentence naming the first compiled candidate the budget stopped or skipped, how far it got,
    and the budget that would let it finish; ``None`` when a compiled candidate finished.

    Example:
        >>> budget_shortfall([], Budget(budget_s=60.0)) is None
        True
    """
    compiled = [r for r in results if r.verdict != "eager"]
    if budget.budget_s is None or any(r.status == "ok" for r in compiled):
        return None
    eager = next((r for r in results if r.name == "eager"), None)
    if eager is not None and eager.status != "ok":
        stopped = eager.metrics.stopped
        if not stopped:
            return None
        need = float(stopped["after_s"])
        return (
            f"the budget ({budget.budget_s / 60:.3g} min) ended {need:.0f} s into eager's "
            "run, the baseline and the cheapest run; eager and then a compiled candidate "
            f"each need more than that: re-run with --budget {math.ceil(2 * need / 60)} or "
            f"more (budget_s={math.ceil(2 * need)})"
        )
    by_budget = [r for r in compiled if (r.reason or "").startswith("budget:")]
    if not by_budget:
        return None
    first = by_budget[0]
    after_compile = _after_compile_s(eager)
    stopped = first.metrics.stopped
    if stopped and first.started_s is not None:
        ran = float(stopped["after_s"])
        steady_at = stopped.get("steady_after_s")
        if steady_at is None:  # still starting or compiling: its compile alone is longer
            need = first.started_s + ran + after_compile
            how = f"was still {_phase(stopped)} when the budget stopped it {ran:.0f} s into its run"
            bound, parts = "more than", "its run so far"
        else:  # compiled; it was timing steady steps
            need = first.started_s + float(steady_at) + after_compile
            how = f"had compiled (after {float(steady_at):.0f} s) and was timing steps when stopped"
            bound, parts = "about", "its start-up and compile"
    else:  # skipped before it started: its compile is unknown, its run longer than eager's
        spent = sum(r.wall_s or 0.0 for r in results[: results.index(first)])
        need = spent + (eager.wall_s if eager is not None and eager.wall_s else 0.0)
        how = "could not start: less budget was left than one run takes"
        bound, parts = "more than", "a run at least as long as eager's"
        after_compile = 0.0
    minutes = math.ceil(need / 60.0)
    return (
        f"no compiled candidate finished within the budget ({budget.budget_s / 60:.3g} min), so "
        f"none was checked: {first.name} {how}; measuring and checking it needs {bound} "
        f"{need / 60:.1f} min of budget in all (what tune spent before it, {parts}"
        + (f", ~{after_compile:.0f} s of timed steps as eager's" if after_compile else "")
        + ", and its check): "
        f"re-run with --budget {minutes}{' or more' if bound == 'more than' else ''} "
        f"(budget_s={math.ceil(need)}), or a smaller --steady-seconds"
    )


def _after_compile_s(eager: CandidateResult | None) -> float:
    """The timed steady steps a run takes after its compile, as eager's took (0 without eager)."""
    if eager is None:
        return 0.0
    return float(eager.metrics.steady_s or sum(eager.metrics.step_times_s))


def _phase(stopped: dict) -> str:
    phase = stopped.get("phase") or "starting"
    return {"build": "building the model", "compile": "compiling", "warm-up": "compiling"}.get(
        phase, "starting"
    )
