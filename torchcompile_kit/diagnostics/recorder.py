"""The logging handler behind :class:`~torchcompile_kit.CompileMonitor`: trace records -> events.

torch's structured trace (``torch.__trace``) emits, per frame compile, in this order:
``dynamo_start`` (the code's name, file and line), artifacts ``recompile_reasons`` and
``dynamo_graph_break_reason``, one ``dynamo_output_graph`` per graph, and ``compilation_metrics``
(name, seconds, failure, recompile reason) last; ``bwd_compilation_metrics`` follows on the first
backward. Records carry ``frame_id``/``frame_compile_id``, which restart at 0 after
``torch._dynamo.reset()`` (and per ``isolate_recompiles`` region), so they are only used to tie
records of one compile *in flight* together; finished compiles are kept in arrival order.

A compile may restart its analysis (``RestartAnalysis``: a graph break met inside an inlined call,
``TensorifyScalarRestartAnalysis`` for a float scalar): dynamo then traces the frame again and
discards what the earlier attempt built, so a graph is counted once, from the attempt that
finished (records carry ``attempt``). A graph break is logged once, in the attempt that met it
(the restarts replay it from dynamo's speculation log), so every break record counts, as dynamo's
``counters["graph_break"]`` does. Each frame and limit hit is tagged with the marked region
running while torch reported it (:mod:`.regions`).
"""

from __future__ import annotations

import json
import logging
import re
import threading
from dataclasses import dataclass, field
from typing import Any

from .. import _dynamo
from .regions import current_region, region_owner
from .trace_records import (
    CompiledFrame,
    GraphBreak,
    LimitHit,
    Recompile,
    graph_sources,
    parse_graph_break,
    parse_limit_hit,
)

__all__ = ["TraceRecorder"]

_Key = tuple[Any, Any, Any]
_LIMIT_WARNING = "torch._dynamo hit config."
_FUNC_INFO = re.compile(r"'(?P<fn>[^']*)' \((?P<file>.*):(?P<line>\d+)\)$")


@dataclass(slots=True)
class _InFlight:
    """What arrived for one compile before its ``compilation_metrics`` record."""

    graphs: int = 0
    attempt: int = 0
    """Dynamo's analysis attempt the graphs belong to (a restart discards the earlier ones)."""
    sources: list[tuple[str, int]] = field(default_factory=list)
    breaks: list[GraphBreak] = field(default_factory=list)
    reasons: list[str] = field(default_factory=list)
    region: str | None = None
    """The marked region running when the compile started."""


class TraceRecorder(logging.Handler):
    """Turns structured-trace records into frames, breaks, recompiles and limit hits.

    Never raises from :meth:`emit`: a record it cannot read is counted in ``unreadable``.
    """

    def __init__(self) -> None:
        super().__init__(level=logging.DEBUG)
        self.frames: list[CompiledFrame] = []
        self.graph_breaks: list[GraphBreak] = []
        self.recompiles: list[Recompile] = []
        self.limit_hits: list[LimitHit] = []
        self.unattributed_backward_seconds = 0.0
        self.records = 0
        self.unreadable = 0
        self._strings: dict[int, str] = {}
        self._starts: dict[_Key, tuple[str, str | None, int | None]] = {}
        self._in_flight: dict[_Key, _InFlight] = {}
        self._break_index: dict[tuple[Any, Any, Any, str], GraphBreak] = {}
        self._by_frame_id: dict[tuple[Any, Any], tuple[str, str | None, int | None]] = {}
        self._limit_function: tuple[str, str | None, int | None] | None = None
        self._mutex = threading.RLock()

    # -- logging.Handler ---------------------------------------------------------------------

    def emit(self, record: logging.LogRecord) -> None:
        try:
            metadata = getattr(record, "metadata", None)
            with self._mutex:
                if isinstance(metadata, dict) and metadata:
                    self.records += 1
                    self._dispatch(metadata, getattr(record, "payload", None))
                elif str(record.msg).startswith(_LIMIT_WARNING) and record.args:
                    # args: (limit_type, limit, "'fn' (file:line)", last_reason, url)
                    where = _FUNC_INFO.match(str(record.args[2]))
                    if where:
                        self._limit_function = (where["fn"], where["file"], int(where["line"]))
        except Exception:  # noqa: BLE001  # an unreadable record must never break a compile
            self.unreadable += 1

    def _dispatch(self, metadata: dict[str, Any], payload: Any) -> None:
        name = next(iter(metadata))
        value = metadata[name]
        key: _Key = (
            metadata.get("compiled_autograd_id"),
            metadata.get("frame_id"),
            metadata.get("frame_compile_id"),
        )
        if name == "str":
            text, index = value
            self._strings[int(index)] = str(text)
        elif name == "dynamo_start":
            code = value["stack"][-1]  # the frame being compiled comes last
            self._starts[key] = (code["name"], self._string(code.get("filename")), code.get("line"))
            self._in_flight.setdefault(key, _InFlight()).region = current_region()
        elif name == "dynamo_output_graph":
            flight = self._in_flight.setdefault(key, _InFlight())
            attempt = int(metadata.get("attempt") or 0)
            if attempt > flight.attempt:  # dynamo restarted its analysis: that graph is gone
                flight.graphs, flight.sources, flight.attempt = 0, [], attempt
            flight.graphs += 1
            if isinstance(payload, str):
                flight.sources.extend(graph_sources(payload))
        elif name == "artifact" and value.get("name") == "dynamo_graph_break_reason":
            found = parse_graph_break(payload or "")
            found.function = self._starts.get(key, (None,))[0]
            self._in_flight.setdefault(key, _InFlight()).breaks.append(found)
        elif name == "artifact" and value.get("name") == "recompile_reasons":
            reasons = json.loads(payload) if payload else []
            reasons = [reasons] if isinstance(reasons, str) else [str(r) for r in reasons]
            self._in_flight.setdefault(key, _InFlight()).reasons = reasons
        elif name == "compilation_metrics" or name == "bwd_compilation_metrics":
            self.add_metrics(value, key=key)

    def _string(self, index: Any) -> str | None:
        if not isinstance(index, int) or index < 0:
            return None
        if index not in self._strings:  # interned before we listened
            text = _dynamo.interned_string(index)
            if text is not None:
                self._strings[index] = text
        return self._strings.get(index)

    # -- one finished compile ------------------------------------------------------------------

    def add_metrics(self, metrics: dict[str, Any], *, key: _Key | None) -> None:
        """Record one ``compilation_metrics`` row."""
        with self._mutex:
            compile_id = str(metrics.get("compile_id") or (f"{key[1]}/{key[2]}" if key else "?"))
            if metrics.get("is_runtime"):
                return
            if metrics.get("is_forward") is False:
                self._add_backward(compile_id, metrics)
                return
            start = self._starts.pop(key, None) if key is not None else None
            if start is None and metrics.get("co_name") is None:
                # a limit hit has neither: the warning just before it, or this frame id's code
                start = self._limit_function or (self._by_frame_id.get(key[:2]) if key else None)
            self._limit_function = None
            flight = self._in_flight.pop(key, None) if key is not None else None
            flight = flight or _InFlight(region=current_region())
            function = metrics.get("co_name") or (start[0] if start else "<unknown>")
            file = metrics.get("co_filename") or (start[1] if start else None)
            line = metrics.get("co_firstlineno") or (start[2] if start else None)
            where = {"function": function, "file": file, "line": line, "compile_id": compile_id}
            if key is not None and metrics.get("co_name"):
                self._by_frame_id[key[:2]] = (function, file, line)
            limit = parse_limit_hit(metrics.get("fail_reason"))
            if limit is not None:
                last = metrics.get("recompile_reason") or (flight.reasons or [None])[0]
                value = limit[0]
                if value is None and limit[1] == "recompile_limit":
                    # torch <= 2.10 names no number; it has no per-call limit either, so the
                    # process-wide one is the limit that was hit
                    value = _dynamo.recompile_limit()
                region = flight.region or current_region()
                self.limit_hits.append(
                    LimitHit(
                        **where,
                        limit=value,
                        limit_type=limit[1],
                        last_reason=last,
                        region=region,
                        owner=region_owner(region, function, file, line, []),
                    )
                )
                return
            failed = None
            if metrics.get("fail_type"):
                reason = str(metrics.get("fail_reason") or "").strip().splitlines()
                failed = f"{metrics['fail_type']}: {reason[0] if reason else ''}".strip()
            index = len(self.frames)
            # the block class it belongs to, known from its marked region (mark_region)
            owner = region_owner(flight.region, function, file, line, flight.sources)
            self.frames.append(
                CompiledFrame(
                    **where,
                    graphs=flight.graphs,
                    ops=metrics.get("graph_op_count"),
                    seconds=_seconds(metrics, "entire_frame_compile_time_s"),
                    recompile_reason=metrics.get("recompile_reason"),
                    failed=failed,
                    region=flight.region,
                    owner=owner,
                    sources=flight.sources,
                )
            )
            for found in flight.breaks:
                found.region, found.owner = flight.region, owner
                self._add_break(found, function=function, compile_id=compile_id, frame=index)
            reason = metrics.get("recompile_reason")
            if reason:
                self.recompiles.append(
                    Recompile(
                        **where,
                        reason=reason,
                        reasons=flight.reasons or [reason],
                        frame=index,
                        region=flight.region,
                        owner=owner,
                    )
                )

    def _add_break(
        self, found: GraphBreak, *, function: str | None, compile_id: str, frame: int | None
    ) -> None:
        same = (found.region, found.file, found.line, found.reason)
        if same in self._break_index:  # met again (a resume frame, a recompile, after reset)
            self._break_index[same].count += found.count
            return
        found.function = found.function or function
        found.compile_id = compile_id
        found.frame = frame
        self._break_index[same] = found
        self.graph_breaks.append(found)

    def _add_backward(self, compile_id: str, metrics: dict[str, Any]) -> None:
        seconds = _seconds(metrics, "entire_frame_compile_time_s")
        for frame in reversed(self.frames):  # the latest compile with this id (ids restart)
            if frame.compile_id == compile_id:
                frame.backward_seconds += seconds
                return
        self.unattributed_backward_seconds += seconds


def _seconds(metrics: dict[str, Any], name: str) -> float:
    value = metrics.get(name)
    if value is None and metrics.get("duration_us") is not None:
        value = metrics["duration_us"] / 1e6
    return float(value or 0.0)
