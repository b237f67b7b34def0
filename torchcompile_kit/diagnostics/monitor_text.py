"""The text of :meth:`CompileMonitor.summary`: one readable table of the record.

It reads a monitor (``Any`` here: the monitor imports this module, not the reverse).
"""

from __future__ import annotations

from typing import Any

from .trace_records import code_label

__all__ = ["format_summary"]

_TORCH_BREAKS_TITLE = (
    "graph breaks in torch's own code (by design there, e.g. torch.optim's "
    "graph_break(); not yours to fix):"
)


def _in_torch(monitor: Any) -> str:
    count = sum(b.count for b in monitor.graph_breaks if b.in_torch)
    return f" ({count} in torch's own code)" if count else ""


def format_summary(monitor: Any) -> str:
    """The monitor's readable table: counts, frames with seconds, breaks, recompiles, limit hits,
    first-call checks, notes (what :meth:`CompileMonitor.summary` prints)."""
    counts = monitor.snapshot()
    lines = [
        (
            f"CompileMonitor: {counts['frames']} frames, {counts['graphs']} graphs, "
            f"{counts['graph_breaks']} graph breaks{_in_torch(monitor)}, "
            f"{counts['recompiles']} recompiles, "
            f"{counts['recompile_limit_hits']} limit hits, "
            f"{counts['compile_seconds']:.2f} s compiling; "
            f"caches: {counts['cache_hits']} hits, {counts['cache_misses']} misses"
        )
    ]
    for hit in monitor.limit_hits:  # loudest first: that code silently runs eagerly now
        lines.append(f"  !! {hit.message()}")
    if monitor.frames:
        lines.append("frames compiled (seconds fwd+bwd, graphs, compile id, code):")
        for frame in monitor.frames:
            extra = f"  FAILED: {frame.failed}" if frame.failed else ""
            lines.append(
                f"  {frame.seconds + frame.backward_seconds:8.3f} s  {frame.graphs} "
                f"graph(s)  [{frame.compile_id}]  {frame.label}  "
                f"({frame.location}){extra}"
            )
    for title, breaks in (
        ("graph breaks (user code, reason):", [b for b in monitor.graph_breaks if not b.in_torch]),
        (_TORCH_BREAKS_TITLE, [b for b in monitor.graph_breaks if b.in_torch]),
    ):
        if breaks:
            lines.append(title)
        for found in breaks:
            code = f" [{found.code}]" if found.code else ""
            times = f" x{found.count}" if found.count > 1 else ""
            inside = (
                f" (in {found.owner or found.function})" if (found.owner or found.function) else ""
            )
            lines.append(f"  {found.location}{inside}{times}: {found.reason}{code}")
    if monitor.recompiles:
        lines.append("recompiles (code, failed guard):")
        for again in monitor.recompiles:
            who = code_label(again.function, again.owner)
            lines.append(f"  [{again.compile_id}] {who} ({again.file}:{again.line}): {again.guard}")
    if monitor.first_call_checks:
        lines.append("first-call checks (compiled vs eager):")
        lines += [f"  {check.message()}" for check in monitor.first_call_checks]
    for note in monitor.notes:
        lines.append(f"note: {note}")
    return "\n".join(lines)
