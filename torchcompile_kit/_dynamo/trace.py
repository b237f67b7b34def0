"""The structured trace CompileMonitor reads.

Part of the one door to torch's private compiler APIs (see ``_dynamo/__init__.py``)."""

from __future__ import annotations

import logging

logger = logging.getLogger(__name__)

__all__ = [
    "LIMIT_WARNING_LOGGER_NAME",
    "TRACE_LOGGER_NAME",
    "close_trace_logger",
    "compile_failure_stack",
    "interned_string",
    "limit_warning_logger",
    "open_trace_logger",
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


def open_trace_logger() -> tuple[logging.Logger, int | None]:
    """torch's structured-trace logger, made to pass DEBUG records on; and the level to restore.

    torch keeps it at DEBUG ("This log is ALWAYS at debug level", torch/_logging/_internal.py);
    only a logging configuration of the user's raises it. Then it is lowered to DEBUG, and the
    level it had is returned for :func:`close_trace_logger` (``None``: left as it was).
    """
    log = logging.getLogger(TRACE_LOGGER_NAME)
    if log.isEnabledFor(logging.DEBUG):
        return log, None
    previous = log.level
    log.setLevel(logging.DEBUG)
    return log, previous


def close_trace_logger(log: logging.Logger, previous: int | None) -> None:
    """Give the trace logger back the level :func:`open_trace_logger` found (if it changed it)."""
    if previous is not None:
        log.setLevel(previous)


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
    from torch._logging.structured import INTERN_TABLE

    for text, number in list(INTERN_TABLE.items()):
        if number == index:
            return text
    return None


# --- compile failures ------------------------------------------------------------------------
# Why: the regional report names where a compile failed ("failed to compile: ... raised in
# encoder.0.gate") instead of "compiled nothing". dynamo's errors derive from
# torch._dynamo.exc.TorchDynamoException (Unsupported, TorchRuntimeError, UserError,
# BackendCompilerFailed, ...), and those raised while tracing carry `real_stack`, the user frames
# being traced (torch/_dynamo/exc.py; present in 2.10-2.15).
# Upstream: https://github.com/pytorch/pytorch/blob/main/torch/_dynamo/exc.py
# Can go when torch.compiler exposes a public compile-error type that carries the user stack.
def compile_failure_stack(err: BaseException) -> list[tuple[str, int]] | None:
    """``None`` unless dynamo raised ``err`` while compiling; else the ``(file, line)`` of the user
    frames it was tracing, innermost last (empty when it has none: a backend's own failure)."""
    import torch._dynamo.exc

    if not isinstance(err, torch._dynamo.exc.TorchDynamoException):
        return None
    stack = getattr(err, "real_stack", None) or []
    return [(frame.filename, frame.lineno) for frame in stack if frame.lineno is not None]
