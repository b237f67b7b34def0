"""The row one recipe produces, and the channel its process reports progress on.

Shared by the parent (:mod:`.runner`) and the recipe's process (:mod:`.execute`), so neither
imports the other's machinery.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

__all__ = [
    "EVENT_PREFIX",
    "BackgroundUse",
    "CacheUse",
    "Metrics",
    "RecipeResult",
    "Speedup",
    "emit_event",
    "set_event_sink",
]

EVENT_PREFIX = "@@tck-event "
"""Stdout lines of the child that start with this carry one JSON progress event."""

Status = Literal["ok", "failed", "skipped"]


@dataclass(kw_only=True, slots=True)
class Speedup:
    """A speed ratio to a baseline recipe (``> 1``: faster), and how it was measured.

    Example:
        >>> Speedup(ratio=1.4, low=1.3, high=1.5, paired=True).interval()
        '1.30–1.50'
    """

    ratio: float
    """Baseline time ÷ this time: the median of paired block ratios, or steps/s ÷ the baseline's."""
    low: float | None = None
    """Low end of the 95% interval (paired blocks; ``None``: too few blocks, or unpaired)."""
    high: float | None = None
    """High end of it."""
    paired: bool = False
    """From blocks stepped beside the baseline's in one process (``False``: rows measured minutes
    apart)."""
    blocks: int | None = None
    """Paired blocks behind it."""
    method: str | None = None
    """How the ratio and its interval were computed."""
    baseline: str | None = None
    """The recipe that stepped beside this one."""

    def interval(self) -> str | None:
        """``"low–high"``, or ``None`` without an interval."""
        if self.low is None or self.high is None:
            return None
        return f"{self.low:.2f}–{self.high:.2f}"

    @classmethod
    def from_row(cls, data: Mapping[str, Any]) -> Speedup | None:
        """A row's speedup from JSON (a results.json row's metrics, a tune.json candidate): the
        grouped form, or the flat ``speedup`` and ``speedup_*`` fields written before it
        (docs/results; tune.json called the flag ``paired``)."""
        value = data.get("speedup")
        if isinstance(value, Mapping):
            return cls(**value)
        if not isinstance(value, (int, float)):
            return None
        return cls(
            ratio=value,
            low=data.get("speedup_low"),
            high=data.get("speedup_high"),
            paired=bool(data.get("speedup_paired", data.get("paired"))),
            blocks=data.get("speedup_blocks"),
            method=data.get("speedup_method"),
            baseline=data.get("speedup_baseline"),
        )


@dataclass(kw_only=True, slots=True)
class CacheUse:
    """What a row did with the compile cache (``compile_cache``): a cold row saves, a warm row
    loads."""

    saved: bool | None = None
    """Cold rows that save: the artifact was written."""
    loaded: bool | None = None
    """Warm rows: the artifact loaded."""
    load_s: float | None = None
    """Warm rows: seconds the load took (part of what the restart costs)."""
    stats: dict[str, int] | None = None
    """Warm rows: torch's dynamo, FX-graph and AOTAutograd cache hits and misses after the run."""


@dataclass(kw_only=True, slots=True)
class BackgroundUse:
    """A background-compile row (``compile_in_background``): what its
    :class:`~torchcompile_kit.regional.BackgroundCompile` recorded."""

    state: str
    """``"compiled"``, or ``"eager"`` when it stayed eager (``BackgroundState``'s value)."""
    eager_steps: int = 0
    """Steps run eagerly before the switch."""
    switched_at_call: int | None = None
    """The call that first ran compiled (``None``: it never switched)."""
    eager_reason: str | None = None
    """Why it stayed eager."""
    start_after_s: float | None = None
    """Seconds after the first step when the worker started."""
    worker_s: float | None = None
    """Seconds the worker compiled."""
    stall_s: float | None = None
    """Seconds the switching step took (loading the worker's compile, its first compiled call)."""
    handoff_s: float | None = None
    """Seconds handing the first batch to the worker."""


def _cache_of(data: Mapping[str, Any]) -> CacheUse:
    """A row's :class:`CacheUse` from JSON: grouped, or the flat ``cache_*`` fields of results
    written before it."""
    value = data.get("cache")
    if isinstance(value, Mapping):
        return CacheUse(**value)
    return CacheUse(**{k: data.get(f"cache_{k}") for k in ("saved", "loaded", "load_s", "stats")})


@dataclass(kw_only=True, slots=True)
class Metrics:
    """What one recipe run measured (in its process), and how it compares with the other rows.

    ``None`` is "not measured" (a skipped row, a metric this run could not take). Round-trips
    through JSON: :meth:`as_dict`, :meth:`from_dict` (keys it does not know are ignored).
    """

    # the run (:func:`.metrics.measure_training`)
    warmup_s: float | None = None
    """Wall time of the first ``warmup_steps`` steps from a cold start, compiling included (for
    recipes that compile every shape up front, that too): the reference post's warm-up time."""
    first_step_s: float | None = None
    """The first of those steps alone."""
    first_step_gc_s: float | None = None
    """Seconds Python's garbage collector ran during the first step (a full collection of a large
    process heap takes a few tenths of a second, in whichever step it falls)."""
    steps_per_s: float | None = None
    """1 / the median steady step."""
    tokens_per_s: float | None = None
    """Median over steady steps of real (non-pad) tokens / step time."""
    padding: float | None = None
    """Pad tokens / computed tokens over all steps (from the attention mask)."""
    peak_memory_mb: float | None = None
    """Peak CUDA memory allocated, or the process's peak resident set on CPU (before the paired
    baseline's copy of the model is built)."""
    peak_reserved_mb: float | None = None
    """Peak CUDA memory the caching allocator reserved (what the process held from the GPU,
    fragmentation and CUDA graphs' pools included); ``None`` on CPU."""
    losses: list[float] = field(default_factory=list)
    """The loss of every step, for the comparison with the loss reference."""
    step_times_s: list[float] = field(default_factory=list)
    """Each timed steady step, seconds."""
    step_ends_s: list[float] = field(default_factory=list)
    """When each of the row's steps (warm-up and steady) ended, seconds from the start of the
    first: the row's steps-against-wall-time curve (paired rows: the baseline's blocks in it)."""
    step_tokens: list[int] = field(default_factory=list)
    """The computed (padded) tokens of each timed steady step."""
    steady_s: float | None = None
    """Seconds of the timed steady steps."""
    warmup_steps: int | None = None
    """Steps timed as warm-up."""
    steps: int | None = None
    """Steady steps timed."""
    cpu_steal: float | None = None
    """Share of the machine's CPU time the hypervisor took during the run (``None`` off Linux)."""
    cpu_steal_steady: float | None = None
    """The same, during the steady steps."""
    cpu_neighbours: float | None = None
    """Share of the machine's CPU time other processes used during the run (``None`` without
    psutil)."""
    cpu_neighbours_steady: float | None = None
    """The same, during the steady steps."""
    paired: dict[str, Any] | None = None
    """Paired blocks (:mod:`.paired`): ``block_steps``, ``base_s`` and ``recipe_s`` (each block's
    step seconds per side), ``baseline``, ``same_batches``; ``None``: not paired."""
    plan_tokens_per_step: float | None = None
    """Mean padded tokens per step over the planned run (``tune``)."""
    # the process around it (:mod:`.execute`)
    import_compiler_s: float | None = None
    """Seconds importing dynamo and inductor (the same in every row)."""
    build_s: float | None = None
    """Seconds building the model."""
    graphs: int | None = None
    """Graphs compiled (``CompileMonitor``)."""
    recompiles: int | None = None
    """Recompiles."""
    graph_breaks: int | None = None
    """Distinct graph breaks."""
    compile_seconds: float | None = None
    """Seconds dynamo and the backend spent compiling."""
    monitor: dict[str, Any] | None = None
    """The whole ``CompileMonitor`` snapshot."""
    cache: CacheUse = field(default_factory=CacheUse)
    """What the row did with the compile cache (every field ``None``: it used none)."""
    background: BackgroundUse | None = None
    """Background-compile rows: what the background compile recorded."""
    regions: dict[str, str] | None = None
    """``compile_regional(precompile=True)`` rows: how each block group compiled (its plan's
    ``precompile_path``: ``"precompiled (no trace)"`` on a warm row whose entries loaded)."""
    check: dict[str, Any] | None = None
    """``tune``'s correctness check of the run (``GateVerdict.as_dict()``)."""
    first_call_checks: list[dict[str, Any]] | None = None
    """``verify=True`` rows: the recipe's first-call checks (``FirstCallCheck.as_dict()``: status,
    ``check_seconds`` against ``compiled_seconds``, what they were judged against)."""
    stopped: dict[str, Any] | None = None
    """``tune``: how far a run its budget stopped had got."""
    notes: list[str] = field(default_factory=list)
    """What else the run said (cache summary, the library's warnings)."""
    repeats: list[dict[str, Any]] = field(default_factory=list)
    """``--repeat``: each run's own figures (the row pools them, :func:`.paired.merge_repeats`)."""
    # across rows (:func:`.metrics.compare`)
    speedup: Speedup | None = None
    """The ratio to the row's baseline, with its interval."""
    warmup_ratio: float | None = None
    """Warm-up ÷ the cold full compile's."""
    loss_max_abs_diff: float | None = None
    """The largest |loss − reference loss| over the steps both ran on the same batches."""
    not_quotable: list[str] | None = None
    """Why the row's timings should not be quoted (empty: they can be)."""

    def as_dict(self) -> dict[str, Any]:
        """The metrics as JSON-ready data."""
        return asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any] | None) -> Metrics:
        """Rebuild from :meth:`as_dict` data (unknown keys are ignored)."""
        data = data or {}
        known = set(cls.__dataclass_fields__) - {"speedup", "cache", "background"}
        background = data.get("background")
        return cls(
            **{k: v for k, v in data.items() if k in known},
            speedup=Speedup.from_row(data),
            cache=_cache_of(data),
            background=BackgroundUse(**background) if background else None,
        )


@dataclass(kw_only=True, slots=True)
class RecipeResult:
    """What one recipe run produced."""

    name: str
    """Recipe name (``"full"``)."""
    status: Status
    """``"ok"``, ``"failed"`` (raised, crashed or timed out) or ``"skipped"`` (cannot run here)."""
    metrics: Metrics = field(default_factory=Metrics)
    """The measurements (empty unless ``ok``)."""
    error: str | None = None
    """Failed: the exception and the tail of its traceback (or of the child's log)."""
    reason: str | None = None
    """Skipped: why (``"needs CUDA graphs; this machine has no CUDA device"``)."""
    group: str = ""
    """The recipe's group (``static``, ``dynamic``, ``warm-up``, ``distributed``, ``custom``)."""
    description: str = ""
    """The recipe's one line (filled in the results document)."""
    wall_s: float | None = None
    """Seconds the whole child process took (start-up and imports included)."""
    stopped_after_s: float | None = None
    """Failed because its process had not ended by its timeout: stopped after these seconds."""
    settings: dict[str, Any] = field(default_factory=dict)
    """What it ran with: preset, steps, backend, compile kwargs, device, model source."""

    def as_dict(self) -> dict[str, Any]:
        """The result as JSON-ready data."""
        return asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> RecipeResult:
        """Rebuild a result from :meth:`as_dict` data (unknown keys are ignored)."""
        known = set(cls.__dataclass_fields__)
        fields = {k: v for k, v in data.items() if k in known}
        return cls(**{**fields, "metrics": Metrics.from_dict(data.get("metrics"))})


_event_sink: Callable[[dict[str, Any]], None] | None = None


def emit_event(**event: Any) -> None:
    """(In the child) report progress to the parent: one JSON line on stdout."""
    if _event_sink is not None:  # in-process mode
        _event_sink(event)
        return
    print(EVENT_PREFIX + json.dumps(event, default=str), flush=True)


def set_event_sink(sink: Callable[[dict[str, Any]], None] | None) -> None:
    """Deliver :func:`emit_event` events to ``sink`` in this process (``None``: to stdout)."""
    global _event_sink
    _event_sink = sink
