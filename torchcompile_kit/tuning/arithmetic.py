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
- ``step_s``: the mean steady step, recompile spikes left out: batches of varying length make
  step times skewed, and a total is a sum, so the mean (not the median) predicts it.

The break-even against eager is the number of steps after which a faster-per-step recipe has paid
back its extra compile time: ``(overhead - eager_overhead) / (eager_step - step)``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

__all__ = ["Cost", "break_even_steps", "cost_from_metrics", "predicted_total"]

_SPIKE = 3.0  # a steady step this many times the median compiled something


@dataclass(kw_only=True, slots=True)
class Cost:
    """The measured cost model of one recipe."""

    compile_s: float
    """One-off seconds before steady speed: compiling (cold or warm) and first-step overhead."""
    recompile_s: float
    """Seconds of steady steps spent compiling new graphs after warm-up (measured spikes)."""
    step_s: float
    """Mean seconds per steady step (recompile spikes left out)."""

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

    Returns:
        The cost model.

    Example:
        >>> cost_from_metrics(warmup_s=12.0, warmup_steps=5, step_s=0.1).compile_s
        11.5
    """
    ranked = sorted(step_times_s, reverse=True)
    spikes = [t for t in ranked if t > _SPIKE * step_s]
    if recompiles is not None:
        spikes = spikes[: max(0, recompiles)]
    steady = ranked[len(spikes) :]
    mean = sum(steady) / len(steady) if steady else step_s
    return Cost(
        compile_s=max(0.0, warmup_s - warmup_steps * mean),
        recompile_s=sum(t - mean for t in spikes),
        step_s=mean,
    )


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
