"""The arithmetic of a planned run: what each recipe costs for ``steps_planned`` steps.

A recipe's wall time for a run of ``N`` steps is predicted as::

    total(N) = compile_s + recompile_s + N * step_s

- ``compile_s``: the warm-up's excess over steady steps, ``warmup_s - warmup_steps * step_s``,
  measured from a true cold start (empty inductor cache) or, for a warm restart, after loading
  the saved compile cache; eager's small first-step overhead is counted the same way;
- ``recompile_s``: the excess of the steady steps that took over ``_SPIKE`` times the median
  (a step that compiled a new graph after warm-up), but only as many of them as dynamo measurably
  recompiled: a long batch in a variable-length run is slow every time it comes, so it stays in
  the mean (leaving those out made the prediction of an eager pad-to-longest run 32% short); a
  longer run that meets new shapes may recompile more than the measured window shows;
- ``step_s``: the steady step for the planned run's batches, recompile spikes left out. When the
  timed steps' padded token counts vary and the planned run's mean count is known, it is the
  least-squares line ``step = a + b * tokens`` of the timed steps read at that mean: a few timed
  steps of a heavy-tailed length mix are not the run's mix (on the captioner, 30 timed steps
  predicted 260 s of a 20,000-step run that took 383 s). Otherwise it is the mean steady step:
  batches of varying length make step times skewed, and a total is a sum, so the mean (not the
  median) predicts it.

The break-even against eager is the number of steps after which a faster-per-step recipe has paid
back its extra compile time: ``(overhead - eager_overhead) / (eager_step - step)``.
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

    Args:
        warmup_s: seconds of the first ``warmup_steps`` steps from the (cold or warm) start.
        warmup_steps: how many steps ``warmup_s`` covers.
        step_s: median seconds of a steady step (``1 / steps_per_s``): the scale of a spike.
        step_times_s: the steady steps' times (after warm-up); spikes become ``recompile_s``,
            the mean of the others is the cost's ``step_s`` (``step_s`` itself when empty).
        recompiles: recompiles dynamo measured in the run (``CompileMonitor``); at most that
            many of the largest spikes count as recompiles, the rest stay in the mean. ``None``:
            not measured, every spike counts as a recompile.
        step_tokens: the padded tokens of each timed step (aligned with ``step_times_s``).
        plan_tokens: the planned run's mean padded tokens per step; with ``step_tokens`` the
            step time is read off the timed steps' line at it (:func:`step_for_tokens`).

    Returns:
        The cost model.

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
    """The step time at ``tokens`` padded tokens, from timed ``(seconds, tokens)`` steps.

    The least-squares line ``seconds = a + b * tokens`` through the steps, read at ``tokens``
    and kept within the fastest and slowest step timed (a line is not trusted beyond them).

    Args:
        steps: timed steady steps, ``(seconds, padded tokens)``.
        tokens: the planned run's mean padded tokens per step.

    Returns:
        The predicted seconds, or ``None`` when the steps do not vary in tokens enough for a
        line (fewer than 3 distinct counts) or time does not grow with tokens (``b <= 0``).

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
    """Predicted wall seconds of a run of ``steps_planned`` steps.

    Args:
        cost: the recipe's cost model.
        steps_planned: steps of the planned run.

    Returns:
        ``compile_s + recompile_s + steps_planned * step_s``.

    Example:
        >>> predicted_total(Cost(compile_s=30.0, recompile_s=0.0, step_s=0.1), 1000)
        130.0
    """
    return cost.overhead_s + steps_planned * cost.step_s


def break_even_steps(cost: Cost, eager: Cost) -> float:
    """Steps after which ``cost``'s recipe is cheaper in total than eager.

    Args:
        cost: the recipe's cost model.
        eager: eager's cost model.

    Returns:
        ``0`` when it is never slower, ``math.inf`` when it never pays back (its steps are not
        faster than eager's), else the (whole) number of steps.

    Example:
        >>> eager = Cost(compile_s=0.0, recompile_s=0.0, step_s=0.2)
        >>> break_even_steps(Cost(compile_s=30.0, recompile_s=0.0, step_s=0.1), eager)
        300
    """
    extra = cost.overhead_s - eager.overhead_s
    if extra <= 0 and cost.step_s <= eager.step_s:
        return 0
    gain = eager.step_s - cost.step_s
    if gain <= 0:
        return math.inf
    return math.ceil(extra / gain - 1e-9)
