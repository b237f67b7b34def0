"""What one recipe measures, the way the seed measures it, and the comparisons across recipes.

In the recipe's process (:func:`measure_training`):

- ``warmup_s``: wall time of the first ``warmup_steps`` steps from a true cold start (empty
  inductor cache, nothing compiled), the seed's "warm-up time"; it includes compiling, and for
  recipes that compile every shape up front (buckets) that pre-compilation too;
- ``first_step_s``: the first of those steps alone;
- ``steps_per_s``: 1 / the median time of the steady steps that follow;
- ``tokens_per_s``: the median over steady steps of real (non-pad) tokens / step time;
- ``padding``: pad tokens / computed tokens over all steps (from the attention mask);
- ``peak_memory_mb``: peak CUDA memory allocated, or on CPU the process's peak resident set
  (each recipe has its own process, so it is the recipe's);
- ``losses``: the loss of every step, for the comparison with eager.

Across recipes (:func:`compare`): ``speedup`` (steps/s ÷ the baseline recipe's, or eager's when
the baseline did not run),
``warmup_ratio`` (warm-up ÷ the baseline's) and ``loss_max_abs_diff`` (the largest |loss − eager
loss| over the steps both ran on the same batches).
"""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Callable, Iterator, Mapping
from typing import Any

__all__ = [
    "METRIC_LABELS", "compare", "cpu_times", "measure_training", "peak_memory_mb", "real_and_computed",
    "steal_share",
]

# metric key -> column label in tables and charts
METRIC_LABELS: dict[str, str] = {
    "warmup_s": "warm-up s",
    "steps_per_s": "steps/s",
    "tokens_per_s": "tokens/s",
    "speedup": "× eager",
    "graphs": "graphs",
    "recompiles": "recompiles",
    "graph_breaks": "breaks",
    "padding": "padding",
    "peak_memory_mb": "peak MB",
    "loss_max_abs_diff": "|Δloss|",
}

_MASK_KEYS = ("decoder_attention_mask", "attention_mask")


def real_and_computed(batch: Mapping[str, Any]) -> tuple[int, int]:
    """(real tokens, computed tokens) of a batch, from its attention mask.

    The decoder's mask when there is one (the captioner's captions), else ``attention_mask``;
    without a mask every position of ``input_ids``/``decoder_input_ids`` counts as real.

    Args:
        batch: a collated batch.

    Returns:
        ``(real, computed)``; ``(0, 0)`` when the batch has no token tensor.
    """
    for key in _MASK_KEYS:
        mask = batch.get(key)
        if mask is not None and hasattr(mask, "numel"):
            return int(mask.sum()), int(mask.numel())
    for key in ("decoder_input_ids", "input_ids"):
        ids = batch.get(key)
        if ids is not None and hasattr(ids, "numel"):
            return int(ids.numel()), int(ids.numel())
    return 0, 0


def cpu_times() -> tuple[int, int] | None:
    """(steal, total) CPU ticks of the whole machine since boot, from ``/proc/stat``; ``None`` off Linux.

    *Steal* is time the hypervisor gave this VM's CPUs to someone else: on a shared cloud VM it is
    what makes a quiet-looking machine slow.
    """
    try:
        with open("/proc/stat") as stat:
            fields = stat.readline().split()
    except OSError:
        return None
    if not fields or fields[0] != "cpu" or len(fields) < 9:
        return None
    ticks = [int(v) for v in fields[1:]]
    return ticks[7], sum(ticks[:8])  # user nice system idle iowait irq softirq steal


def steal_share(before: tuple[int, int] | None, after: tuple[int, int] | None) -> float | None:
    """The share of the machine's CPU time stolen by the hypervisor between two :func:`cpu_times`.

    Example:
        >>> steal_share((100, 1000), (150, 1500))
        0.1
    """
    if before is None or after is None or after[1] <= before[1]:
        return None
    return (after[0] - before[0]) / (after[1] - before[1])


def peak_memory_mb(device: Any) -> float:
    """Peak memory of this process: CUDA max allocated, or the CPU peak resident set (MiB)."""
    import torch

    if getattr(device, "type", str(device)) == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**20
    import resource
    import sys

    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak / 2**20 if sys.platform == "darwin" else peak / 2**10  # bytes on macOS, KiB on Linux


def measure_training(
    step: Callable[[dict[str, Any]], Any],
    batches: Iterator[dict[str, Any]],
    *,
    warmup_steps: int,
    steps: int,
    device: Any,
    before_first_step: Callable[[], None] | None = None,
    on_step: Callable[[int, int, str], None] | None = None,
    min_steady_s: float = 0.0,
    max_steps: int | None = None,
) -> dict[str, Any]:
    """Run ``warmup_steps + steps`` training steps and measure them.

    With ``min_steady_s``, the steady steps go on until they have taken that many seconds, so
    their mean is a stretch of the machine's time and not one burst: a shared machine's speed
    drifts by a third within a minute with no CPU steal to show it (a captioner's 30 steps said
    15 ms where its 20,000 steps averaged 24 ms).

    Args:
        step: one training step, ``step(batch) -> loss`` (a tensor or float); it moves the batch
            to the device itself.
        batches: yields at least ``warmup_steps + steps`` batches.
        warmup_steps: steps timed together as warm-up (compilation happens here).
        steps: steady steps timed one by one afterwards.
        device: the training device (synchronized around timings when it is CUDA).
        before_first_step: called inside the warm-up timing before the first step (e.g.
            compiling every bucket shape up front).
        on_step: progress callback ``(step_index, total, phase)``; ``total`` grows when the
            steady steps are extended to ``min_steady_s``.
        min_steady_s: time at least this many seconds of steady steps (``steps`` or more).
        max_steps: never time more steady steps than this (``None``: no cap), e.g. the planned
            run's length.

    Returns:
        ``warmup_s``, ``first_step_s``, ``steps_per_s``, ``tokens_per_s``, ``padding``,
        ``peak_memory_mb``, ``losses``, ``step_times_s`` with ``step_tokens`` (the computed,
        padded tokens of each timed step), ``cpu_steal``/``cpu_steal_steady`` (the share of the
        machine's CPU time the hypervisor took during the run / the steady steps; ``None`` off
        Linux), ``steady_s`` (seconds of the timed steady steps) and ``steps`` (how many were
        timed) / ``warmup_steps``.
    """
    import torch

    cuda = getattr(device, "type", str(device)) == "cuda"
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    if cuda:
        torch.cuda.reset_peak_memory_stats(device)
    total = warmup_steps + steps
    losses: list[float] = []
    times: list[float] = []
    real_tokens: list[int] = []
    computed_tokens: list[int] = []
    real_sum = computed_sum = 0
    sync()
    cpu_start = cpu_times()
    start = time.perf_counter()
    if before_first_step is not None:
        before_first_step()
    first_step_s = warmup_s = None
    cpu_warm = cpu_start
    index = 0
    while index < total:
        batch = next(batches)
        real, computed = real_and_computed(batch)
        real_sum, computed_sum = real_sum + real, computed_sum + computed
        began = time.perf_counter()
        loss = step(batch)
        losses.append(float(loss))  # also a sync point: the step has finished
        sync()
        ended = time.perf_counter()
        if index == 0:
            first_step_s = ended - began
        if index == warmup_steps - 1:
            warmup_s = ended - start
            cpu_warm = cpu_times()
        if index >= warmup_steps:
            times.append(ended - began)
            real_tokens.append(real)
            computed_tokens.append(computed)
        if index == total - 1 and times:
            total += _extra_steps(times, min_steady_s, max_steps)
        if on_step is not None:
            on_step(index + 1, total, "warm-up" if index < warmup_steps else "steady")
        index += 1
    median = statistics.median(times) if times else None
    cpu_end = cpu_times()
    return {
        "warmup_s": warmup_s,
        "first_step_s": first_step_s,
        "steps_per_s": 1 / median if median else None,
        "tokens_per_s": statistics.median(r / t for r, t in zip(real_tokens, times)) if times else None,
        "padding": 1 - real_sum / computed_sum if computed_sum else None,
        "peak_memory_mb": peak_memory_mb(device),
        "losses": losses,
        "step_times_s": times,
        "step_tokens": computed_tokens,
        "cpu_steal": steal_share(cpu_start, cpu_end),
        "cpu_steal_steady": steal_share(cpu_warm, cpu_end) if warmup_steps and times else None,
        "steady_s": sum(times),
        "warmup_steps": warmup_steps,
        "steps": len(times),
    }


def _extra_steps(times: list[float], min_steady_s: float, max_steps: int | None) -> int:
    """Steady steps still to time so that they take ``min_steady_s`` in all (at most
    ``max_steps`` in all), estimated from the mean step so far (a compile spike in it makes the
    estimate short, and the steps are extended again when they end)."""
    short = min_steady_s - sum(times)
    if short <= 0:
        return 0
    extra = math.ceil(short / max(sum(times) / len(times), 1e-6))
    if max_steps is not None:
        extra = min(extra, max_steps - len(times))
    return max(0, extra)


def compare(rows: list[dict[str, Any]], recipes: Mapping[str, Any]) -> None:
    """Add ``speedup``, ``warmup_ratio`` and ``loss_max_abs_diff`` to each ok row, in place.

    Args:
        rows: result rows (``RecipeResult.to_dict()``), each with ``name``, ``status``, ``metrics``.
        recipes: name -> recipe (its ``baseline`` and ``loss_reference`` names); rows whose recipe
            is unknown (a custom ``tune`` row) compare with ``"eager"``.
    """
    by_name = {row["name"]: row for row in rows if row.get("status") == "ok"}
    for row in by_name.values():
        recipe = recipes.get(row["name"])
        metrics = row["metrics"]
        # the group's baseline (eager-longest for dynamic shapes), else eager when it did not run
        base = by_name.get(getattr(recipe, "baseline", None) or "eager") or by_name.get("eager")
        if base is not None and metrics.get("steps_per_s") and base["metrics"].get("steps_per_s"):
            metrics["speedup"] = metrics["steps_per_s"] / base["metrics"]["steps_per_s"]
        cold = by_name.get(getattr(recipe, "warmup_baseline", None) or "full")
        if cold is not None and metrics.get("warmup_s") and cold["metrics"].get("warmup_s"):
            metrics["warmup_ratio"] = metrics["warmup_s"] / cold["metrics"]["warmup_s"]
        ref_name = getattr(recipe, "loss_reference", "eager") if recipe is not None else "eager"
        ref = by_name.get(ref_name) if ref_name else None
        if ref is not None and ref is not row:
            pairs = list(zip(metrics.get("losses") or [], ref["metrics"].get("losses") or []))
            if pairs:
                metrics["loss_max_abs_diff"] = max(abs(a - b) for a, b in pairs)
        elif ref is row:
            metrics["loss_max_abs_diff"] = 0.0
