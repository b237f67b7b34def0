"""The arithmetic of a planned run: ``total(N) = compile_s + recompile_s + N * step_s`` per recipe.

How each term is measured, and the break-even against eager, are in docs/tune.md
("The arithmetic").
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

__all__ = ["Cost", "break_even_steps", "cost_from_metrics", "predicted_total", "step_for_tokens"]

_SPIKE = 3.0  # a steady step this many times the median compiled something


@dataclass(kw_only=True, slots=True)
class Cost:
    """The measured cost model of one recipe."""

    compile_s: float
    """One-off seconds before steady speed: compiling (cold or warm) and first-step overhead."""
    recompile_s: float
    """Seconds of steady steps spent compiling new graphs after warm-up (measured spikes)."""
    step_s: float
    """Seconds per steady step of the planned run (recompile spikes left out)."""
    measured_step_s: float | None = None
    """Mean seconds of the timed steady steps, when ``step_s`` was scaled to the run's tokens."""
    eager_steps: float | None = None
    """A background compile: the steps trained eagerly (at ``eager_step_s``) while its worker
    compiles; ``overhead_s`` is then the stall at the switch beyond a compiled step."""
    eager_step_s: float | None = None
    """Seconds per eager step before that switch."""

    @property
    def overhead_s(self) -> float:
        """``compile_s + recompile_s``: what the run pays once."""
        return self.compile_s + self.recompile_s


def cost_from_metrics(
    *,
    warmup_s: float,
    warmup_steps: int,
    step_s: float,
    step_times_s: Sequence[float] = (),
    recompiles: int | None = None,
    step_tokens: Sequence[int] = (),
    plan_tokens: float | None = None,
) -> Cost:
    """The :class:`Cost` of a recipe from the bench runner's metrics.

    Steady steps over ``_SPIKE`` times ``step_s`` (the median) are recompiles, at most
    ``recompiles`` of them (``None``: all); the mean of the others is the step, or, with
    ``step_tokens`` and ``plan_tokens``, the timed steps' line read at the planned tokens
    (:func:`step_for_tokens`).

    Example:
        >>> cost_from_metrics(warmup_s=12.0, warmup_steps=5, step_s=0.1).compile_s
        11.5
    """
    tokens = list(step_tokens) if len(step_tokens) == len(step_times_s) else [0] * len(step_times_s)
    ranked = sorted(zip(step_times_s, tokens), key=lambda pair: pair[0], reverse=True)
    spikes = [t for t, _ in ranked if t > _SPIKE * step_s]
    if recompiles is not None:
        spikes = spikes[: max(0, recompiles)]
    steady = ranked[len(spikes) :]
    mean = sum(t for t, _ in steady) / len(steady) if steady else step_s
    planned = step_for_tokens(steady, plan_tokens) if plan_tokens else None
    return Cost(
        compile_s=max(0.0, warmup_s - warmup_steps * mean),
        recompile_s=sum(t - mean for t in spikes),
        step_s=planned if planned is not None else mean,
        measured_step_s=mean if planned is not None else None,
    )


def step_for_tokens(steps: Sequence[tuple[float, int]], tokens: float) -> float | None:
    """The least-squares line ``seconds = a + b * tokens`` of timed ``(seconds, tokens)`` steps,
    read at ``tokens`` and kept within the fastest and slowest step; ``None`` with fewer than 3
    distinct token counts or when time does not grow with tokens.

    Example:
        >>> step_for_tokens([(0.010, 1000), (0.020, 2000), (0.030, 3000)], 2500)
        0.025
    """
    if len({n for _, n in steps}) < 3:
        return None
    n = len(steps)
    mean_t = sum(t for t, _ in steps) / n
    mean_x = sum(x for _, x in steps) / n
    sxx = sum((x - mean_x) ** 2 for _, x in steps)
    slope = sum((x - mean_x) * (t - mean_t) for t, x in steps) / sxx
    if slope <= 0:
        return None
    fastest, slowest = min(t for t, _ in steps), max(t for t, _ in steps)
    return round(min(max(mean_t + slope * (tokens - mean_x), fastest), slowest), 12)


def predicted_total(cost: Cost, steps_planned: int) -> float:
    """``compile_s + recompile_s + steps_planned * step_s``; a background compile's first
    ``eager_steps`` at ``eager_step_s`` (and its overhead only once it switched).

    Example:
        >>> predicted_total(Cost(compile_s=30.0, recompile_s=0.0, step_s=0.1), 1000)
        130.0
        >>> predicted_total(Cost(compile_s=0.5, recompile_s=0.0, step_s=0.1, eager_steps=100,
        ...                      eager_step_s=0.2), 1000)  # doctest: +NORMALIZE_WHITESPACE
        110.5
    """
    if cost.eager_steps is None:
        return cost.overhead_s + steps_planned * cost.step_s
    if steps_planned <= cost.eager_steps:
        return steps_planned * cost.eager_step_s
    return (
        cost.eager_steps * cost.eager_step_s
        + cost.overhead_s
        + (steps_planned - cost.eager_steps) * cost.step_s
    )


def break_even_steps(cost: Cost, eager: Cost) -> float:
    """Steps after which ``cost``'s recipe is cheaper in total than eager: ``0`` when never slower,
    ``math.inf`` when its steps are not faster.

    Example:
        >>> eager = Cost(compile_s=0.0, recompile_s=0.0, step_s=0.2)
        >>> break_even_steps(Cost(compile_s=30.0, recompile_s=0.0, step_s=0.1), eager)
        300
    """
    if cost.eager_steps is not None:  # as eager until the switch, then the stall to win back
        if cost.step_s >= eager.step_s:
            return math.inf
        return math.ceil(cost.eager_steps + cost.overhead_s / (eager.step_s - cost.step_s) - 1e-9)
    extra = cost.overhead_s - eager.overhead_s
    if extra <= 0 and cost.step_s <= eager.step_s:
        return 0
    gain = eager.step_s - cost.step_s
    if gain <= 0:
        return math.inf
    return math.ceil(extra / gain - 1e-9)
