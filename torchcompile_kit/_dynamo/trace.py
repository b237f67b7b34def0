"""The structured trace and compile metrics CompileMonitor reads.

Part of the one door to torch's private compiler APIs (see ``_dynamo/__init__.py``)."""

from __future__ import annotations

import logging
from typing import Any

logger = logging.getLogger(__name__)

__all__ = [
    "compilation_metrics_since",
    "graph_break_counts",
    "interned_string",
    "limit_warning_logger",
    "trace_logger",
]


# --- structured trace / compile events -------------------------------------------------------
# Why: CompileMonitor (diagnostics/monitor.py) records what dynamo compiled from torch's structured
# trace, the passive, always-on event stream behind TORCH_TRACE/tlparse: `trace_structured` emits a
# record to the `torch.__trace` logger whenever that logger has a handler (it checks
# `trace_log.handlers`, torch/_logging/_internal.py), so adding our handler is the only change.
# Upstream: https://github.com/pytorch/pytorch/pull/120289 (structured trace logs, 2024); the
# record names used (`dynamo_start`, `dynamo_output_graph`, `compilation_metrics`,
# `bwd_compilation_metrics`, artifacts `recompile_reasons`/`dynamo_graph_break_reason`, `str`)
# verified in torch 2.13 (_dynamo/convert_frame.py, utils.py, guards.py, symbolic_convert.py).
# Can go when torch.compiler offers a public event API (compile callbacks are cleared by reset()
# and silent on recompile-limit hits, so `torch._dynamo.callback` is no substitute).
TRACE_LOGGER_NAME = "torch.__trace"


def trace_logger() -> logging.Logger | None:
    """torch's structured-trace logger, or ``None`` if it would not pass records on.

    ``None`` when the logger was set above DEBUG (logging configuration can do that); the monitor
    then falls back to :func:`compilation_metrics_since` and says so in its summary.
    """
    log = logging.getLogger(TRACE_LOGGER_NAME)
    return log if log.isEnabledFor(logging.DEBUG) else None


LIMIT_WARNING_LOGGER_NAME = "torch._dynamo.convert_frame"


def limit_warning_logger() -> logging.Logger:
    """The logger of dynamo's "hit config.recompile_limit" WARNING (names the function).

    Why: the trace's record of a limit hit has no function name (``co_name`` is None and no
    ``dynamo_start`` is emitted, torch 2.13); the warning's ``record.args`` hold
    ``(limit_type, limit, "'fn' (file:line)", last_reason, url)``
    (torch/_dynamo/convert_frame.py). Can go with the trace section above.
    """
    return logging.getLogger(LIMIT_WARNING_LOGGER_NAME)


def interned_string(index: int) -> str | None:
    """The string torch's trace interned as ``index`` (file names in ``dynamo_start`` stacks).

    Why: each string is emitted once per process as a ``str`` record; one interned before the
    monitor started is only in ``torch._logging.structured.INTERN_TABLE`` (private). Can go with
    the trace section above.
    """
    try:
        from torch._logging.structured import INTERN_TABLE
    except ImportError:
        return None
    for text, number in list(INTERN_TABLE.items()):
        if number == index:
            return text
    return None


def compilation_metrics_since(start_time_us: int) -> list[dict[str, Any]]:
    """torch's per-frame compilation metrics that started at or after ``start_time_us``.

    The weaker source, used where the trace is missing: ``torch._dynamo.utils.
    get_compilation_metrics()`` keeps only the last 64 frames (a capped deque) and has no
    graph-break locations. Same fields as the trace's ``compilation_metrics`` records.
    Can go with the trace section above.
    """
    import dataclasses

    try:
        from torch._dynamo.utils import get_compilation_metrics
    except ImportError:
        return []
    rows = []
    for metric in get_compilation_metrics():
        row = dataclasses.asdict(metric)
        if (row.get("start_time_us") or 0) >= start_time_us:
            rows.append(row)
    return rows


def graph_break_counts() -> dict[str, int]:
    """``torch._dynamo.utils.counters["graph_break"]``: reason -> count, without locations.

    The fallback for graph breaks where the trace is missing. Process-wide, not cleared by
    ``torch._dynamo.reset()``. Can go with the trace section above.
    """
    from torch._dynamo.utils import counters

    return {str(reason): int(n) for reason, n in counters["graph_break"].items()}
