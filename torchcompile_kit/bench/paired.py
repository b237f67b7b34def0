"""Numbers that hold on a busy machine: paired ratios with an interval, and who else used the CPU.

The recipe's process steps an eager copy and the recipe in alternating blocks on the same batches
(:func:`.metrics.measure_training`); this module turns the blocks into a ratio with a bootstrap
interval, says whether other processes or the hypervisor took the CPU, and pools ``--repeat``
runs. docs/benchmarks.md ("Reading the intervals") says what each figure means.
"""

from __future__ import annotations

import dataclasses
import math
import os
import statistics
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from .outcome import Metrics, Speedup

__all__ = [
    "CONFIDENCE",
    "MIN_BLOCKS",
    "NEIGHBOUR_LIMIT",
    "STEAL_LIMIT",
    "WIDTH_LIMIT",
    "CpuSnapshot",
    "RerunSpread",
    "block_steps_for",
    "cpu_snapshot",
    "merge_repeats",
    "neighbour_share",
    "not_quotable",
    "paired_ratio",
    "ratio_interval",
    "rerun_spread",
    "speedup_unquotable",
    "widen_for_rerun",
]

CONFIDENCE = 0.95
"""Confidence level of the interval."""
MIN_BLOCKS = 5
"""Fewer blocks give no interval (a median of 4 numbers has no useful bootstrap)."""
WIDTH_LIMIT = 0.20
"""An interval wider than this share of its ratio (``(high - low) / ratio``, i.e. about ±10%)
is too wide to quote."""
NEIGHBOUR_LIMIT = 0.10
"""Other processes using more than this share of the machine's CPU time during a row (0.2 of
one core on a 2-core machine) make its timings not quotable."""
STEAL_LIMIT = 0.05
"""Above this share of CPU time stolen by the hypervisor, a row's timings are not quotable."""
_RESAMPLES = 2000


def block_steps_for(steps: int) -> int:
    """Steps per side in one block: short blocks keep the two sides close in time, and many blocks
    let the median outvote a rare slow step (60 blocks of 2 held a ratio within 3% under load where
    20 blocks of 6 moved it by 20%).

    Example:
        >>> block_steps_for(20), block_steps_for(120), block_steps_for(600)
        (1, 2, 10)
    """
    return max(1, steps // 60)


def ratio_interval(
    base_s: Sequence[float],
    recipe_s: Sequence[float],
    *,
    same_batches: bool = True,
) -> Speedup:
    """The ratio ``baseline time ÷ recipe time`` of paired blocks, with its interval (at
    :data:`CONFIDENCE`).

    The median of the per-block ratios when both sides stepped on the same samples
    (``same_batches``), else the ratio of total seconds bootstrapped over blocks. Returns a paired
    :class:`~.outcome.Speedup` (``low``/``high`` ``None`` under :data:`MIN_BLOCKS` blocks); raises
    ``ValueError`` on unequal sides, no block or a non-positive time.

    Example:
        >>> r = ratio_interval([0.2] * 10, [0.1] * 10)
        >>> r.ratio, r.low, r.high
        (2.0, 2.0, 2.0)
    """
    base, recipe = [float(v) for v in base_s], [float(v) for v in recipe_s]
    if len(base) != len(recipe) or not base:
        raise ValueError(
            f"paired blocks need as many baseline as recipe times, at least one; got "
            f"{len(base)!r} and {len(recipe)!r}"
        )
    if min(base + recipe) <= 0:
        raise ValueError(f"block times must be positive seconds, got {min(base + recipe)!r}")
    ratios = [b / r for b, r in zip(base, recipe)]
    if same_batches:
        ratio, method = statistics.median(ratios), "median of block ratios"
    else:
        ratio, method = sum(base) / sum(recipe), "ratio of totals"
    low = high = None
    if len(ratios) >= MIN_BLOCKS:
        low, high, how = _interval(base, recipe, ratios, same_batches)
        # the percentile bootstrap of a median can sit just beside it on few distinct values
        low, high = min(low, ratio), max(high, ratio)
        method += f", {how}"
    return Speedup(ratio=ratio, low=low, high=high, paired=True, blocks=len(ratios), method=method)


def _interval(
    base: list[float],
    recipe: list[float],
    ratios: list[float],
    same_batches: bool,
) -> tuple[float, float, str]:
    try:
        import numpy as np
        from scipy import stats
    except ImportError:  # the bench extra is not installed: the spread of the block ratios
        q1, _, q3 = statistics.quantiles(ratios, n=4, method="inclusive")
        return q1, q3, "IQR (install scipy for a bootstrap interval)"
    rng = np.random.default_rng(0)  # the same blocks give the same interval
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # degenerate data (every block alike) is fine here
        if same_batches:
            result = stats.bootstrap(
                (np.asarray(ratios),),
                np.median,
                confidence_level=CONFIDENCE,
                n_resamples=_RESAMPLES,
                method="percentile",
                random_state=rng,
                batch=100,
            )
        else:
            result = stats.bootstrap(
                (np.asarray(base), np.asarray(recipe)),
                lambda b, r, axis=-1: b.sum(axis=axis) / r.sum(axis=axis),
                paired=True,
                vectorized=True,
                confidence_level=CONFIDENCE,
                n_resamples=_RESAMPLES,
                method="percentile",
                random_state=rng,
                batch=100,
            )
    low, high = float(result.confidence_interval.low), float(result.confidence_interval.high)
    if not (np.isfinite(low) and np.isfinite(high)):
        low = high = float(np.median(ratios)) if same_batches else sum(base) / sum(recipe)
    return low, high, "bootstrap"


def paired_ratio(metrics: Metrics) -> Speedup | None:
    """The ratio and interval of a row's paired blocks (``metrics.paired``), or ``None``.

    Example:
        >>> paired_ratio(Metrics(paired={"baseline": "eager", "base_s": [[2.0, 2.2]] * 5,
        ...                              "recipe_s": [[1.0,
        ...     1.1]] * 5, "same_batches": True})).ratio
        2.0
    """
    paired = metrics.paired
    if not isinstance(paired, Mapping) or not paired.get("base_s"):
        return None
    same = bool(paired.get("same_batches", True))
    # a block's side: the median of its steps on the same batches (a step that waited for a
    # descheduled thread does not make its block slow), else their total (other batch mixes)
    block = statistics.median if same else sum
    result = ratio_interval(
        [block(_steps(b)) for b in paired["base_s"]],
        [block(_steps(r)) for r in paired["recipe_s"]],
        same_batches=same,
    )
    return dataclasses.replace(result, baseline=paired.get("baseline"))


def _steps(block: Any) -> list[float]:
    """A block's step seconds (a list), or its one number (a block given as its total)."""
    return list(block) if isinstance(block, (list, tuple)) else [float(block)]


# --- between processes: what a rerun of the same code gives --------------------------------------


@dataclass(frozen=True, slots=True)
class RerunSpread:
    """How far the ratio of the same compiled code moved between processes of one run."""

    log_spread: float
    """``|ln(ratio_a / ratio_b)|``, the largest over the pairs measured."""
    between: str
    """What was compared: ``"full and full-warm"``, ``"the 3 rounds of regional"``."""

    @property
    def percent(self) -> float:
        """The spread as a share of the ratio (``e^spread - 1``)."""
        return math.exp(self.log_spread) - 1


def rerun_spread(
    rows: Mapping[str, Any], same_code: Mapping[str, str | None]
) -> RerunSpread | None:
    """The largest move of a paired ratio between processes that ran the same compiled code: a
    warm row against the cold row whose cache it loaded (``same_code``: row -> that row), and the
    rounds of one row under ``--repeat``. ``None`` when the run has neither.

    A paired interval covers the spread of the blocks inside one process; a process started
    minutes later lands elsewhere (other memory layout, CPU frequency, neighbours), measured: the
    same code at 1.10–1.18 and 1.08–1.09 in two rows of one quiet run.

    Example:
        >>> rows = {"full": Metrics(speedup=Speedup(ratio=1.14, paired=True)),
        ...         "full-warm": Metrics(speedup=Speedup(ratio=1.085, paired=True))}
        >>> round(rerun_spread(rows, {"full-warm": "full"}).percent, 3)
        0.051
    """
    found: list[tuple[float, str]] = []
    for name, metrics in rows.items():
        other = rows.get(same_code.get(name) or "")
        mine, theirs = metrics.speedup, other.speedup if other is not None else None
        if mine is not None and theirs is not None and mine.paired and theirs.paired:
            found.append(
                (abs(math.log(mine.ratio / theirs.ratio)), f"{same_code[name]} and {name}")
            )
        rounds = [r["speedup"] for r in metrics.repeats if r.get("speedup")]
        if len(rounds) > 1:
            found.append(
                (math.log(max(rounds) / min(rounds)), f"the {len(rounds)} rounds of {name}")
            )
    if not found:
        return None
    log_spread, between = max(found)
    return RerunSpread(log_spread=log_spread, between=between)


def widen_for_rerun(metrics: Metrics, spread: RerunSpread | None) -> None:
    """Widen a paired row's interval, in place, by the spread between processes, so that it covers
    what a rerun of the same code gives; the method says so. Without a spread, the method says the
    interval is of this process only."""
    speedup = metrics.speedup
    if speedup is None or speedup.low is None or speedup.high is None:
        return
    if spread is None:
        speedup.method = (
            f"{speedup.method}; this process only (a rerun may "
            "land outside it: run a warm row or --repeat 2 to measure)"
        )
        return
    factor = math.exp(spread.log_spread)
    speedup.low, speedup.high = speedup.low / factor, speedup.high * factor
    speedup.method = (
        f"{speedup.method}, widened by ±{spread.percent:.1%}: the "
        f"ratio's spread between processes ({spread.between}, same code)"
    )


# --- the machine: who else used the CPU ----------------------------------------------------------


@dataclass(frozen=True, slots=True)
class CpuSnapshot:
    """CPU seconds at one moment: the whole machine's and this process tree's."""

    busy_s: float
    """CPU seconds every process of the machine ran (all CPUs; idle, iowait and steal excluded)."""
    total_s: float
    """CPU seconds of all CPUs, busy or not (steal included)."""
    own_s: float
    """CPU seconds this process and its descendants ran (waited-for children included)."""


def _own_cpu_seconds(psutil: Any) -> float:
    """This process and every live descendant, each with the children it has waited for
    (inductor's compile workers and probes are descendants: the row's own work)."""
    me = psutil.Process(os.getpid())
    total = 0.0
    for proc in [me, *me.children(recursive=True)]:
        try:
            t = proc.cpu_times()
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            continue
        total += (
            t.user
            + t.system
            + getattr(t, "children_user", 0.0)
            + getattr(t, "children_system", 0.0)
        )
    return total


def cpu_snapshot() -> CpuSnapshot | None:
    """The machine's and this process tree's CPU seconds now; ``None`` without psutil."""
    try:
        import psutil
    except ImportError:
        return None
    times = psutil.cpu_times()
    idle = times.idle + getattr(times, "iowait", 0.0)
    steal = getattr(times, "steal", 0.0)
    # guest time is already inside user (Linux); the rest of the fields sum to the CPUs' time
    fields = ("user", "nice", "system", "idle", "iowait", "irq", "softirq", "steal")
    total = sum(getattr(times, name, 0.0) for name in fields)
    return CpuSnapshot(busy_s=total - idle - steal, total_s=total, own_s=_own_cpu_seconds(psutil))


def neighbour_share(before: CpuSnapshot | None, after: CpuSnapshot | None) -> float | None:
    """The share of the machine's CPU time that *other* processes used between two snapshots (what
    the hypervisor's steal does not count).

    Example:
        >>> neighbour_share(CpuSnapshot(busy_s=10, total_s=100, own_s=5),
        ...                 CpuSnapshot(busy_s=60, total_s=200, own_s=35))
        0.2
    """
    if before is None or after is None or after.total_s <= before.total_s:
        return None
    others = (after.busy_s - before.busy_s) - (after.own_s - before.own_s)
    return max(0.0, others / (after.total_s - before.total_s))


# --- marking -------------------------------------------------------------------------------------


def not_quotable(metrics: Metrics) -> list[str]:
    """Why a row's timings should not be quoted (wide interval, neighbours, steal); empty when they
    can be.

    Example:
        >>> not_quotable(Metrics(cpu_neighbours=0.31,  # doctest: +NORMALIZE_WHITESPACE
        ...     cpu_steal=0.0))
        ["other processes used 31% of the machine's CPU during it (limit 10%)"]
    """
    reasons = []
    shares = [s for s in (metrics.cpu_neighbours, metrics.cpu_neighbours_steady) if s is not None]
    if shares and max(shares) > NEIGHBOUR_LIMIT:
        reasons.append(
            f"other processes used {max(shares):.0%} of the machine's CPU during it "
            f"(limit {NEIGHBOUR_LIMIT:.0%})"
        )
    steal = metrics.cpu_steal
    if steal is not None and steal > STEAL_LIMIT:
        reasons.append(
            f"the hypervisor took {steal:.0%} of the CPU time (steal; limit {STEAL_LIMIT:.0%})"
        )
    why = speedup_unquotable(metrics.speedup)
    return reasons + ([why] if why else [])


def speedup_unquotable(speedup: Speedup | None) -> str:
    """Why a paired ratio cannot be quoted (too few blocks for an interval, or an interval wider
    than :data:`WIDTH_LIMIT` of it); ``""`` when it can (the bench's rule, the doctor's too).

    Example:
        >>> speedup_unquotable(Speedup(ratio=1.0, low=0.5, high=1.5, paired=True, blocks=12))
        'its 95% interval 0.50–1.50 spans 100% of the ratio (limit 20%)'
    """
    if speedup is None:
        return ""
    ratio, low, high, blocks = speedup.ratio, speedup.low, speedup.high, speedup.blocks
    if blocks is not None and (low is None or high is None):
        return (
            f"{blocks} paired blocks are too few for an interval (at least {MIN_BLOCKS}: more "
            "--steps)"
        )
    if ratio and low is not None and high is not None and (high - low) / ratio > WIDTH_LIMIT:
        return (
            f"its {CONFIDENCE:.0%} interval {low:.2f}–{high:.2f} spans "
            f"{(high - low) / ratio:.0%} of the ratio (limit {WIDTH_LIMIT:.0%})"
        )
    return ""


# --- --repeat ------------------------------------------------------------------------------------

_MEDIAN_KEYS = (
    "warmup_s",
    "first_step_s",
    "tokens_per_s",
    "cpu_neighbours",
    "cpu_neighbours_steady",
    "cpu_steal",
    "cpu_steal_steady",
    "peak_memory_mb",
)


def merge_repeats(results: Sequence[Any]) -> Any:
    """The runs of one recipe under ``--repeat`` as one result: steady steps and paired blocks
    pooled, warm-up, tokens/s, memory and machine shares the runs' medians, the rest the first ok
    run's; ``metrics.repeats`` keeps each run's own figures."""
    ok = [r for r in results if r.status == "ok"]
    if len(results) == 1 or not ok:
        return results[-1]
    merged = type(ok[0]).from_dict(ok[0].as_dict())
    metrics = merged.metrics
    for key in _MEDIAN_KEYS:
        values = [getattr(r.metrics, key) for r in ok if getattr(r.metrics, key) is not None]
        setattr(metrics, key, statistics.median(values) if values else None)
    times = [t for r in ok for t in r.metrics.step_times_s]
    metrics.step_times_s = times
    metrics.step_tokens = [n for r in ok for n in r.metrics.step_tokens]
    metrics.steps, metrics.steady_s = len(times), sum(times)
    metrics.steps_per_s = 1 / statistics.median(times) if times else None
    pairs = [r.metrics.paired for r in ok if r.metrics.paired]
    if pairs:
        metrics.paired = {
            **pairs[0],
            "base_s": [s for p in pairs for s in p["base_s"]],
            "recipe_s": [s for p in pairs for s in p["recipe_s"]],
        }
    metrics.repeats = [_repeat_summary(r) for r in results]
    merged.wall_s = sum(r.wall_s or 0.0 for r in results)
    return merged


def _repeat_summary(result: Any) -> dict[str, Any]:
    m = result.metrics
    summary: dict[str, Any] = {"status": result.status}
    for key in ("warmup_s", "steps_per_s", "cpu_neighbours", "cpu_steal"):
        summary[key] = getattr(m, key)
    ratio = paired_ratio(m)
    if ratio is not None:
        summary.update(speedup=ratio.ratio, speedup_low=ratio.low, speedup_high=ratio.high)
    return summary
