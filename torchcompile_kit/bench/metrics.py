"""What one recipe measures (:func:`measure_training`, the way the reference post measures it) and
the comparisons across recipes (:func:`compare`); the fields are :class:`~.outcome.Metrics`.
"""

from __future__ import annotations

import contextlib
import gc
import math
import statistics
import time
from collections.abc import Callable, Iterator, Mapping
from typing import Any

from .outcome import Metrics, Speedup

__all__ = [
    "METRIC_LABELS",
    "compare",
    "cpu_times",
    "measure_training",
    "peak_memory_mb",
    "peak_reserved_mb",
    "real_and_computed",
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
    """``(real, computed)`` tokens of a batch from the decoder's or the attention mask (every
    position real without one; ``(0, 0)`` without a token tensor)."""
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
    """(steal, total) CPU ticks of the whole machine since boot, from ``/proc/stat``; ``None`` off
    Linux.

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


def peak_reserved_mb(device: Any) -> float | None:
    """Peak CUDA memory the caching allocator reserved from the GPU (MiB): what the process held,
    its pools and fragmentation included (CUDA graphs' private pools too); ``None`` on CPU."""
    import torch

    if getattr(device, "type", str(device)) != "cuda":
        return None
    return torch.cuda.max_memory_reserved(device) / 2**20


def peak_memory_mb(device: Any) -> float:
    """Peak memory of this process: CUDA max allocated, or the CPU peak resident set (MiB)."""
    import torch

    if getattr(device, "type", str(device)) == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**20
    import resource
    import sys

    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return (
        peak / 2**20 if sys.platform == "darwin" else peak / 2**10
    )  # bytes on macOS, KiB on Linux


@contextlib.contextmanager
def _collector_seconds() -> Iterator[list[float]]:
    """Seconds Python's cyclic garbage collector ran in the block (``[seconds]``,
    filled at exit)."""
    spent, started = [0.0], []

    def note(phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            started.append(time.perf_counter())
        elif started:
            spent[0] += time.perf_counter() - started.pop()

    gc.callbacks.append(note)
    try:
        yield spent
    finally:
        gc.callbacks.remove(note)


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
    baseline: Callable[[], tuple[Callable[[dict[str, Any]], Any], Iterator[dict[str, Any]]]]
    | None = None,
    block_steps: int | None = None,
    keep_going: Callable[[], bool] | None = None,
) -> Metrics:
    """Run ``warmup_steps + steps`` training steps (``step(batch) -> loss``) and measure them.

    The warm-up is timed as one (compilation happens there; ``before_first_step`` runs inside it).
    With ``min_steady_s`` the steady steps go on until they took that long (a burst of a few steps
    measures one moment of a shared machine, not its mean), at most ``max_steps``. With ``baseline``
    (``() -> (step, batches)``, an eager copy built after the warm-up) the steady steps are paired:
    the two step in alternating blocks of ``block_steps`` on the same batches (:mod:`.paired`).
    ``on_step(index, total, phase)`` reports progress; while ``keep_going()`` says so the steady
    steps go on past ``steps`` (a background compile's row: until it switched), at most
    ``max_steps``. Returns the run's :class:`~.outcome.Metrics`.
    """
    import torch

    from .paired import block_steps_for, cpu_snapshot, neighbour_share

    cuda = getattr(device, "type", str(device)) == "cuda"
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    if cuda:
        torch.cuda.reset_peak_memory_stats(device)
    losses: list[float] = []
    times: list[float] = []
    ends: list[float] = []
    real_tokens: list[int] = []
    computed_tokens: list[int] = []
    sums = [0, 0]  # real, computed tokens over every step

    def run(batch: dict[str, Any]) -> float:
        real, computed = real_and_computed(batch)
        sums[0], sums[1] = sums[0] + real, sums[1] + computed
        began = time.perf_counter()
        loss = step(batch)
        losses.append(float(loss))  # also a sync point: the step has finished
        sync()
        ends.append(time.perf_counter())
        return ends[-1] - began

    def timed_step(total: int) -> float:
        batch = next(batches)
        seconds = run(batch)
        real, computed = real_and_computed(batch)
        times.append(seconds)
        real_tokens.append(real)
        computed_tokens.append(computed)
        if on_step is not None:
            on_step(warmup_steps + len(times), total, "steady")
        return seconds

    sync()
    cpu_start, machine_start = cpu_times(), cpu_snapshot()
    start = time.perf_counter()
    if before_first_step is not None:
        before_first_step()
    first_step_s = first_step_gc_s = None
    for index in range(warmup_steps):
        with _collector_seconds() as collected:
            seconds = run(next(batches))
        if index == 0:
            first_step_s, first_step_gc_s = seconds, collected[0]
        if on_step is not None:
            on_step(index + 1, warmup_steps + steps, "warm-up")
    sync()
    warmup_s = time.perf_counter() - start if warmup_steps else None
    peak, reserved = peak_memory_mb(device), peak_reserved_mb(device)
    paired = None
    if baseline is not None and steps:
        base_step, base_batches = baseline()
        for _ in range(warmup_steps or 1):  # its first steps allocate; the streams then align
            base_step(next(base_batches))
        sync()
        paired = {
            "block_steps": block_steps or block_steps_for(steps),
            "base_s": [],
            "recipe_s": [],
        }
    cpu_warm, machine_warm = cpu_times(), cpu_snapshot()
    total = warmup_steps + steps
    while len(times) < total - warmup_steps:
        if paired is None:
            timed_step(total)
        else:
            n = min(paired["block_steps"], total - warmup_steps - len(times))
            sides = ["recipe", "base"] if len(paired["base_s"]) % 2 == 0 else ["base", "recipe"]
            block: dict[str, list[float]] = {"recipe": [], "base": []}
            for side in sides:
                for _ in range(n):
                    block[side].append(
                        timed_step(total)
                        if side == "recipe"
                        else _base_step(base_step, base_batches, sync)
                    )
            paired["base_s"].append(block["base"])
            paired["recipe_s"].append(block["recipe"])
        if len(times) == total - warmup_steps and times:
            other = sum(map(sum, paired["base_s"])) if paired else 0.0
            total += _extra_steps(times, min_steady_s, max_steps, other_s=other)
            if (
                keep_going is not None
                and keep_going()
                and (max_steps is None or len(times) < max_steps)
            ):
                total += 1
    median = statistics.median(times) if times else None
    cpu_end, machine_end = cpu_times(), cpu_snapshot()
    return Metrics(
        warmup_s=warmup_s,
        first_step_s=first_step_s,
        first_step_gc_s=first_step_gc_s,
        steps_per_s=1 / median if median else None,
        tokens_per_s=statistics.median(r / t for r, t in zip(real_tokens, times))
        if times
        else None,
        padding=1 - sums[0] / sums[1] if sums[1] else None,
        peak_memory_mb=peak if paired is not None else peak_memory_mb(device),
        peak_reserved_mb=reserved if paired is not None else peak_reserved_mb(device),
        losses=losses,
        step_times_s=times,
        step_ends_s=[end - start for end in ends],
        step_tokens=computed_tokens,
        cpu_steal=steal_share(cpu_start, cpu_end),
        cpu_steal_steady=steal_share(cpu_warm, cpu_end) if warmup_steps and times else None,
        cpu_neighbours=neighbour_share(machine_start, machine_end),
        cpu_neighbours_steady=neighbour_share(machine_warm, machine_end) if times else None,
        steady_s=sum(times),
        warmup_steps=warmup_steps,
        steps=len(times),
        paired=paired,
    )


def _base_step(
    step: Callable[[dict[str, Any]], Any],
    batches: Iterator[dict[str, Any]],
    sync: Callable[[], None],
) -> float:
    """One timed step of the paired baseline (its loss is not kept)."""
    batch = next(batches)
    began = time.perf_counter()
    float(step(batch))
    sync()
    return time.perf_counter() - began


def _extra_steps(
    times: list[float], min_steady_s: float, max_steps: int | None, *, other_s: float = 0.0
) -> int:
    """Steady steps still to time so that they (and ``other_s`` seconds of the paired baseline's
    steps) take ``min_steady_s`` in all (at most ``max_steps`` in all), estimated from the mean
    step so far (a compile spike in it makes the estimate short, and the steps are extended
    again when they end)."""
    spent = sum(times) + other_s
    short = min_steady_s - spent
    if short <= 0:
        return 0
    extra = math.ceil(short / max(spent / len(times), 1e-6))
    if max_steps is not None:
        extra = min(extra, max_steps - len(times))
    return max(0, extra)


def compare(rows: list[Any], recipes: Mapping[str, Any]) -> None:
    """Fill ``speedup`` (with its interval), ``warmup_ratio``, ``loss_max_abs_diff`` and
    ``not_quotable`` of each ok row's :class:`~.outcome.Metrics`, in place: a paired row's speedup
    is the median of its block ratios; an unpaired row divides its steps/s by its baseline row's.
    Rows of an unknown recipe (a custom ``tune`` row) compare with ``"eager"``.
    """
    from .paired import not_quotable, paired_ratio, rerun_spread, widen_for_rerun

    by_name = {row.name: row for row in rows if row.status == "ok"}
    for row in by_name.values():
        row.metrics.speedup = paired_ratio(row.metrics)
    # the same compiled code in two processes: what a rerun gives, so every interval covers it
    same_code = {name: getattr(recipes.get(name), "cache_from", None) for name in by_name}
    spread = rerun_spread({name: row.metrics for name, row in by_name.items()}, same_code)
    for row in by_name.values():
        recipe = recipes.get(row.name)
        metrics = row.metrics
        # the group's baseline (eager-longest for dynamic shapes), else eager when it did not run
        base = by_name.get(getattr(recipe, "baseline", None) or "eager") or by_name.get("eager")
        if metrics.speedup is not None:
            widen_for_rerun(metrics, spread)
        elif base is not None and metrics.steps_per_s and base.metrics.steps_per_s:
            metrics.speedup = Speedup(
                ratio=metrics.steps_per_s / base.metrics.steps_per_s,
                paired=base is row,  # a baseline is its own pair
                baseline=base.name,
            )
        metrics.not_quotable = not_quotable(metrics)
        cold = by_name.get("full")
        if cold is not None and metrics.warmup_s and cold.metrics.warmup_s:
            metrics.warmup_ratio = metrics.warmup_s / cold.metrics.warmup_s
        ref_name = getattr(recipe, "loss_reference", "eager") if recipe is not None else "eager"
        ref = by_name.get(ref_name) if ref_name else None
        if ref is not None and ref is not row:
            pairs = list(zip(metrics.losses, ref.metrics.losses))
            if pairs:
                metrics.loss_max_abs_diff = max(abs(a - b) for a, b in pairs)
        elif ref is row:
            metrics.loss_max_abs_diff = 0.0
