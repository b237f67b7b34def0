"""``CompileMonitor``: a measured record of what dynamo compiled while it was active.

It listens to torch's structured trace (the stream behind ``TORCH_TRACE``/tlparse) with a logging
handler of its own, removed on exit; nested monitors each add their own. Where a logging
configuration raised torch's trace logger above DEBUG, it is lowered while recording.
"""

from __future__ import annotations

import contextlib
import logging
from collections import defaultdict
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from .. import _dynamo
from .._collect import Collector
from .monitor_text import format_summary
from .recorder import TraceRecorder
from .selection import classes_of, frame_selector
from .trace_records import (
    CompileCounts,
    CompiledFrame,
    GraphBreak,
    LimitHit,
    MonitorRecord,
    Recompile,
    owner_of,
)

if TYPE_CHECKING:  # Python 3.11's typing.Self, for the annotation only
    from typing import Self

__all__ = [
    "CompileMonitor",
    "first_call_checks_made",
    "note_running_monitors",
    "record_first_call_check",
]

_CACHE_HITS = ("fxgraph_cache_hit", "autograd_cache_hit")
_CACHE_MISSES = ("fxgraph_cache_miss", "autograd_cache_miss")
# the monitors recording now, in start order: the first-call checks report to each of them
_RUNNING: list[CompileMonitor] = []
_CHECKS_MADE: Collector[Any] = Collector()  # for first_call_checks_made()


def record_first_call_check(check: Any) -> None:
    """Give a first-call check (a ``FirstCallCheck``) to every running monitor (internal).

    Example:
        >>> record_first_call_check(record)  # doctest: +SKIP
    """
    for monitor in _RUNNING:
        monitor._first_call_checks.append(check)
    _CHECKS_MADE.add(check)


def first_call_checks_made() -> contextlib.AbstractContextManager[list[Any]]:
    """The first-call checks made inside the block, without a monitor's tracing (internal: the
    background worker reports its check to the training process).

    Example:
        >>> with first_call_checks_made() as checks:  # doctest: +SKIP
        ...     model(batch)
    """
    return _CHECKS_MADE.collecting()


def note_running_monitors(text: str) -> None:
    """Add ``text`` to the notes of every running monitor (an event a recipe reports, internal)."""
    for monitor in _RUNNING:
        monitor.add_note(text)


class CompileMonitor:
    """Record every frame compiled, graph break, recompile and recompile-limit hit while active.

    A context manager, or :meth:`start`/:meth:`stop` around a training loop; it may be read while it
    runs (:meth:`snapshot` for a training log). Experimental: it reads torch's structured trace
    (a private API whose texts may change, ``_dynamo/trace.py``); the label can go when
    ``torch.compiler`` offers a public compile-event API.

    Example:
        >>> f = torch.compile(lambda x: x.sin() + 1, backend="eager")
        >>> with CompileMonitor() as mon:
        ...     _ = f(torch.ones(3))
        >>> mon.snapshot()["graphs"]
        1
    """

    def __init__(self) -> None:
        self._recorder = TraceRecorder()
        self._logger: Any = None
        self._logger_level: int | None = None
        self._running = False
        self._cache_done: dict[str, int] = defaultdict(int)
        self._cache_start: dict[str, int] = {}
        self._notes: list[str] = []
        self._first_call_checks: list[Any] = []

    # -- lifetime -----------------------------------------------------------------------------

    def start(self) -> CompileMonitor:
        """Start recording (again after :meth:`stop`: the record accumulates); returns self.
        ``RuntimeError`` when already recording."""
        if self._running:
            raise RuntimeError("CompileMonitor.start(): already recording; call stop() first")
        self._running = True
        _RUNNING.append(self)
        self._cache_start = _dynamo.compile_cache_counters()
        self._logger, self._logger_level = _dynamo.open_trace_logger()
        self._logger.addHandler(self._recorder)
        _dynamo.limit_warning_logger().addHandler(self._recorder)
        if not self._logger.isEnabledFor(logging.DEBUG):
            self.add_note(
                "logging.disable() suppresses torch's structured trace: nothing is recorded"
            )
        return self

    def stop(self) -> None:
        """Stop recording and remove the handler it added (nothing else is touched).

        Example:
            >>> mon = CompileMonitor().start()
            >>> mon.stop()
        """
        if not self._running:
            return
        self._logger.removeHandler(self._recorder)
        _dynamo.limit_warning_logger().removeHandler(self._recorder)
        _dynamo.close_trace_logger(self._logger, self._logger_level)
        for name, value in self._cache_delta().items():
            self._cache_done[name] += value
        self._running = False
        if self in _RUNNING:
            _RUNNING.remove(self)

    @property
    def running(self) -> bool:
        """Whether it is recording now (between :meth:`start` and :meth:`stop`)."""
        return self._running

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- the record ---------------------------------------------------------------------------

    @property
    def frames(self) -> list[CompiledFrame]:
        """Every frame compile, in order (recompiles included; limit hits are not frames)."""
        return self._recorder.frames

    @property
    def graph_breaks(self) -> list[GraphBreak]:
        """Distinct graph breaks (same line and reason once, with ``count``)."""
        return self._recorder.graph_breaks

    @property
    def recompiles(self) -> list[Recompile]:
        """Every recompile, with the failed guard."""
        return self._recorder.recompiles

    @property
    def limit_hits(self) -> list[LimitHit]:
        """Every recompile-limit hit: that code runs eagerly from then on."""
        return self._recorder.limit_hits

    @property
    def first_call_checks(self) -> list[Any]:
        """Every first-call check (``verify=``) a fragile recipe ran while recording, passed,
        partial, failed or skipped (``FirstCallCheck``)."""
        return list(self._first_call_checks)

    @property
    def notes(self) -> list[str]:
        """What the record could not see, and where weaker sources stood in."""
        return list(self._notes)

    def snapshot(self) -> dict[str, Any]:
        """Running counts, flat and JSON-able, for a training log: ``frames``, ``graphs``,
        ``graph_breaks`` (distinct) and ``graph_breaks_met``, ``recompiles``, ``compile_seconds``,
        ``recompile_limit_hits``, ``cache_hits`` and ``cache_misses``.

        Example:
            >>> with CompileMonitor() as mon:
            ...     pass
            >>> mon.snapshot()["recompiles"]
            0
        """
        return self._counts(
            self.frames, self.graph_breaks, self.recompiles, self.limit_hits, self.compile_seconds()
        ).as_dict()

    def compile_seconds(self) -> float:
        """Seconds spent compiling, forward and backward, as torch measured them.

        Example:
            >>> CompileMonitor().compile_seconds()
            0.0
        """
        total = sum(f.seconds + f.backward_seconds for f in self.frames)
        return total + self._recorder.unattributed_backward_seconds

    def seconds_by_function(self) -> dict[str, float]:
        """Compile seconds per compiled function (``label @ file:line``), largest first.

        Example:
            >>> mon.seconds_by_function()  # doctest: +SKIP
            {'GPT2Block.forward (via forward_with_checkpointing) @ .../modeling_layers.py:88': 3.4}
        """
        return _seconds_by_function(self.frames)

    def cache(self) -> dict[str, int]:
        """Cache hits and misses (``fxgraph_cache_hit``, ``autograd_cache_miss``, ...) so far.

        Example:
            >>> with CompileMonitor() as mon:
            ...     pass
            >>> mon.cache()["fxgraph_cache_hit"]
            0
        """
        delta = self._cache_delta() if self._running else {}
        names = set(self._cache_done) | set(delta)
        return {name: self._cache_done.get(name, 0) + delta.get(name, 0) for name in sorted(names)}

    def as_dict(self) -> dict[str, Any]:
        """The full record, JSON-serialisable (``counts``, ``frames``, breaks, recompiles, limit
        hits, seconds by function, cache, notes, first-call checks)."""
        record = self._record(
            range(len(self.frames)), self.graph_breaks, self.recompiles, self.limit_hits
        ).as_dict()
        record["first_call_checks"] = [c.as_dict() for c in self._first_call_checks]
        return record

    def summary(self) -> str:
        """A readable table: counts, frames with seconds, breaks, recompiles, limit hits, notes.

        Example:
            >>> print(CompileMonitor().summary().split(", 0 graph breaks")[0])
            CompileMonitor: 0 frames, 0 graphs
        """
        return format_summary(self)

    # -- attribution to modules ---------------------------------------------------------------

    def attribute(self, *targets: nn.Module | type) -> None:
        """Name the module class each frame belongs to (``owner``, e.g. ``GPT2Block``) from the
        graph's source lines: transformers runs every block through one wrapper, so the frame's code
        does not tell. ``targets`` are models (every submodule's class counts) or classes."""
        classes = classes_of(targets)
        for frame in self.frames:
            frame.owner = (
                owner_of(frame.function, frame.file, frame.line, frame.sources, classes)
                or frame.owner
            )
        for event in [*self.graph_breaks, *self.recompiles]:
            if event.frame is not None:
                event.owner = self.frames[event.frame].owner
        for hit in self.limit_hits:
            hit.owner = owner_of(hit.function, hit.file, hit.line, [], classes) or hit.owner

    def record_for(
        self, target: nn.Module | type | torch.optim.Optimizer | Callable[..., Any]
    ) -> MonitorRecord:
        """The part of the record belonging to a model or module class (its attributed frames),
        an optimizer (frames of ``torch/optim`` and its class's file) or a function (with its
        resumed frames).

        Example:
            >>> mon.record_for(optimizer).counts.recompiles  # doctest: +SKIP
            0
        """
        if not isinstance(target, torch.optim.Optimizer) and isinstance(target, (nn.Module, type)):
            self.attribute(target)  # frames name their owner class, which the selector matches
        keep = frame_selector(target)
        frames = [
            i
            for i, frame in enumerate(self.frames)
            if keep(frame.function, frame.file, frame.line, frame.owner)
        ]
        chosen = set(frames)
        return self._record(
            frames,
            [b for b in self.graph_breaks if b.frame in chosen],
            [r for r in self.recompiles if r.frame in chosen],
            [h for h in self.limit_hits if keep(h.function, h.file, h.line, h.owner)],
        )

    def record_for_region(self, region: str) -> MonitorRecord:
        """The part of the record dynamo compiled while a marked region's call ran (its frames,
        resumed code and callees, breaks, recompiles and limit hits;
        :func:`~torchcompile_kit.diagnostics.mark_region`)."""
        frames = [i for i, frame in enumerate(self.frames) if frame.region == region]
        chosen = set(frames)
        return self._record(
            frames,
            [b for b in self.graph_breaks if b.region == region],
            [r for r in self.recompiles if r.frame in chosen],
            [h for h in self.limit_hits if h.region == region],
        )

    def add_note(self, text: str) -> None:
        """Add a line to the record's ``notes`` (and the summary), once: what the library's
        recipes report while the monitor runs (:func:`note_running_monitors`)."""
        if text not in self._notes:
            self._notes.append(text)

    # -- internals ----------------------------------------------------------------------------

    def _record(
        self,
        frames: Iterable[int],
        breaks: list[GraphBreak],
        recompiles: list[Recompile],
        hits: list[LimitHit],
    ) -> MonitorRecord:
        chosen = [self.frames[i] for i in frames]
        by_function = _seconds_by_function(chosen)
        return MonitorRecord(
            counts=self._counts(chosen, breaks, recompiles, hits, sum(by_function.values())),
            frames=chosen,
            graph_breaks=breaks,
            recompiles=recompiles,
            limit_hits=hits,
            compile_seconds_by_function={k: round(v, 6) for k, v in by_function.items()},
            cache=self.cache(),
            notes=self.notes,
        )

    def _counts(
        self,
        frames: list[Any],
        breaks: list[GraphBreak],
        recompiles: list[Recompile],
        hits: list[LimitHit],
        seconds: float,
    ) -> CompileCounts:
        """The flat counts of :meth:`snapshot`, for any part of the record."""
        cache = self.cache()
        return CompileCounts(
            frames=len(frames),
            graphs=sum(f.graphs for f in frames),
            graph_breaks=len(breaks),
            graph_breaks_met=sum(b.count for b in breaks),
            recompiles=len(recompiles),
            compile_seconds=round(seconds, 6),
            recompile_limit_hits=len(hits),
            cache_hits=sum(cache.get(k, 0) for k in _CACHE_HITS),
            cache_misses=sum(cache.get(k, 0) for k in _CACHE_MISSES),
        )

    def _cache_delta(self) -> dict[str, int]:
        now = _dynamo.compile_cache_counters()
        return {name: now[name] - self._cache_start.get(name, 0) for name in now}


def _seconds_by_function(frames: Iterable[Any]) -> dict[str, float]:
    """Compile seconds per ``label @ file:line``, forward and backward, largest first."""
    totals: dict[str, float] = defaultdict(float)
    for frame in frames:
        totals[f"{frame.label} @ {frame.location}"] += frame.seconds + frame.backward_seconds
    return dict(sorted(totals.items(), key=lambda item: -item[1]))
