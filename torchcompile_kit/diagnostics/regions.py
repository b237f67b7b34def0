"""Compiled regions: which region's call dynamo was compiling when it compiled a frame.

Code objects say little about who compiled them (transformers runs every block through one
wrapper), but every frame dynamo compiles for a region is compiled while the region's call is on
the stack; so the call sets a context variable while it runs, and :class:`CompileMonitor` tags
frames, breaks, recompiles and limit hits with the innermost region (docs/diagnostics.md). A compile
that raises inside a region's call is kept as a :class:`CompileFailure` (the error still
propagates): the regional report then names the module it was raised in.
"""

from __future__ import annotations

import dis
import itertools
import logging
import time
from collections.abc import Callable, Iterable
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from .. import _dynamo
from .trace_records import owner_of

__all__ = [
    "CompileFailure",
    "compile_failure",
    "current_region",
    "grad_modes",
    "mark_call",
    "mark_region",
    "region_owner",
    "set_recompile_limit",
    "was_called",
]

logger = logging.getLogger(__name__)

_CURRENT: ContextVar[str | None] = ContextVar("torchcompile_kit_region", default=None)
_NUMBERS = itertools.count()
_FAILURES: dict[str, CompileFailure] = {}
_CALLED: set[str] = set()
_LIMITS: dict[str, int] = {}
_GRAD_MODES: dict[str, set[bool]] = {}
_CLASSES: dict[str, list[type]] = {}


@dataclass(frozen=True, slots=True)
class CompileFailure:
    """A compile that raised inside a marked region's call (the first one of the region)."""

    error: str
    """``"Type: first line of the message"``."""
    block: str
    """The block whose call raised (its path in the model, or its class)."""
    module: str
    """The module the failing user code belongs to (``"encoder.0.gate"``): the innermost traced
    frame that is a ``forward`` of a module inside the block; the block itself when none is."""
    location: str
    """``file:line`` of the innermost traced user frame, ``""`` when dynamo gave none (a
    backend's own failure)."""

    def __str__(self) -> str:
        where = f"raised in {self.module}" + (f", {self.location}" if self.location else "")
        return f"{self.error} ({where})"


def was_called(region: str) -> bool:
    """Whether a marked region's call ran at least once (outside an outer compile).

    Example:
        >>> was_called("GPT2Block#0")
        False
    """
    return region in _CALLED


def grad_modes(region: str) -> frozenset[bool]:
    """The grad modes ``region``'s calls ran in (``True``: training, ``False``: under
    ``torch.no_grad()``); dynamo guards the grad mode, so each is a graph of its own.

    Example:
        >>> grad_modes("GPT2Block#0")
        frozenset()
    """
    return frozenset(_GRAD_MODES.get(region, ()))


def compile_failure(region: str | None) -> CompileFailure | None:
    """The first compile failure inside ``region``'s calls (:func:`mark_region`), or ``None``.

    Example:
        >>> compile_failure("GPT2Block#0") is None
        True
    """
    return _FAILURES.get(region) if region is not None else None


def set_recompile_limit(region: str, limit: int | None) -> None:
    """Let ``region``'s calls compile under a recompile limit of at least ``limit`` (``None``:
    dynamo's own). Read at every call, so a limit raised after compile (more shapes expected)
    holds from the next call; it is raised only while the region's calls run.

    Example:
        >>> set_recompile_limit("GPT2Block#0", 16)
    """
    if limit is None:
        _LIMITS.pop(region, None)
    else:
        _LIMITS[region] = limit


def current_region() -> str | None:
    """The label of the innermost marked region running now, or ``None``.

    Example:
        >>> current_region() is None
        True
    """
    return _CURRENT.get()


def mark_region(
    modules: Iterable[nn.Module],
    label: str,
    *,
    names: Iterable[str] | None = None,
    limit: int | None = None,
) -> str:
    """Tag every compile inside these compiled modules' calls with one region; returns its id (the
    key for :meth:`CompileMonitor.record_for_region`).

    Call it after ``module.compile()``: each compiled call is wrapped to set :func:`current_region`
    while it runs (stepping aside under an outer compile); ``uncompile`` removes it. The first call
    of each module is logged at INFO before and after, with its seconds. ``label`` is readable (the
    group's class name); ``names`` are the modules' paths in the model, for a
    :class:`CompileFailure`; ``limit`` is the region's recompile limit
    (:func:`set_recompile_limit`); uncompiled modules are skipped.

    Example:
        >>> region = mark_region(blocks, "GPT2Block")  # doctest: +SKIP
        >>> monitor.record_for_region(region).counts.graphs  # doctest: +SKIP
        1
    """
    region = f"{label}#{next(_NUMBERS)}"
    modules = list(modules)
    _CLASSES[region] = list(dict.fromkeys(type(m) for m in modules))
    names = list(names) if names is not None else [label] * len(modules)
    set_recompile_limit(region, limit)
    for module, name in zip(modules, names, strict=True):
        _dynamo.wrap_compiled_call(
            module, lambda call, m=module, n=name: _in_region(call, region, m, n)
        )
    return region


def region_owner(
    region: str | None,
    function: str,
    file: str | None,
    line: int | None,
    sources: list[tuple[str, int]],
) -> str | None:
    """The module class a frame compiled in ``region`` belongs to (``"GPT2Block"``): the one whose
    ``forward`` the graph's source lines trace (transformers runs every block through one wrapper,
    so the frame's code does not tell), or whose ``forward`` the frame is (a block whose forward
    holds no op of its own); ``None`` outside a :func:`mark_region` region, or when none fits."""
    classes = _CLASSES.get(region or "", [])
    found = owner_of(function, file, line, sources, classes) if classes else None
    if found is not None:
        return found
    for cls in classes:
        code = getattr(getattr(cls, "forward", None), "__code__", None)
        if code is not None and (function, file, line) == (
            code.co_name,
            code.co_filename,
            code.co_firstlineno,
        ):
            return cls.__name__
    return None


def mark_call(
    call: Callable[..., Any], label: str, *, limit: int | None = None
) -> tuple[Callable[..., Any], str]:
    """:func:`mark_region` for a compiled function (``torch.compile(loss_fn)``): the wrapped
    function to call instead, and the region's id.

    Example:
        >>> fn, region = mark_call(torch.compile(torch.sin, backend="eager"), "sin")
        >>> fn(torch.zeros(1))
        tensor([0.])
    """
    region = f"{label}#{next(_NUMBERS)}"
    set_recompile_limit(region, limit)
    return _in_region(call, region, None, label), region


def _in_region(
    call: Callable[..., Any], region: str, module: nn.Module | None, name: str
) -> Callable[..., Any]:
    first = [True]  # per module: its first call is where a cold compile stalls the loop
    modes = _GRAD_MODES.setdefault(region, set())

    def run(*args: Any, **kwargs: Any) -> Any:
        if torch.compiler.is_compiling():  # traced by an outer compile: be transparent
            return call(*args, **kwargs)
        modes.add(torch.is_grad_enabled())
        limit = _LIMITS.get(region)
        if limit is None:
            return in_region(*args, **kwargs)
        with _dynamo.recompile_limit_at_least(limit):
            return in_region(*args, **kwargs)

    def in_region(*args: Any, **kwargs: Any) -> Any:
        token = _CURRENT.set(region)
        try:
            if not first[0]:
                return call(*args, **kwargs)
            first[0] = False
            _CALLED.add(region)  # once per module, not on every call
            logger.info(
                "%s: first compiled call: dynamo compiles it now (minutes for a large "
                "block with inductor on CPU) ...",
                region,
            )
            start = time.perf_counter()
            result = call(*args, **kwargs)
            logger.info(
                "%s: first compiled call done in %.1f s (the backward compiles at the "
                "first backward())",
                region,
                time.perf_counter() - start,
            )
            return result
        except Exception as err:
            stack = _dynamo.compile_failure_stack(err)
            if stack is not None and region not in _FAILURES:
                _FAILURES[region] = _failure(err, stack, module, name)
            raise
        finally:
            _CURRENT.reset(token)

    return run


def _failure(
    err: Exception, stack: list[tuple[str, int]], block: nn.Module | None, name: str
) -> CompileFailure:
    message = next((line.strip() for line in str(err).splitlines() if line.strip()), "")
    location = f"{stack[-1][0]}:{stack[-1][1]}" if stack else ""
    return CompileFailure(
        error=f"{type(err).__name__}: {message}",
        block=name,
        module=_module_of(stack, block, name),
        location=location,
    )


def _module_of(stack: list[tuple[str, int]], block: nn.Module | None, name: str) -> str:
    """The path of the module inside ``block`` whose ``forward`` holds the innermost frame of
    ``stack`` that any of them holds (deepest module first); ``name`` when none does."""
    spans: list[tuple[str, str, int, int]] = []
    for path, module in block.named_modules() if block is not None else ():
        code = getattr(getattr(type(module), "forward", None), "__code__", None)
        if code is not None:
            lines = [line for _, line in dis.findlinestarts(code) if line is not None]
            spans.append((path, code.co_filename, min(lines, default=0), max(lines, default=0)))
    for filename, line in reversed(stack):
        paths = [
            path for path, file, low, high in spans if file == filename and low <= line <= high
        ]
        if paths:
            deepest = max(paths, key=lambda p: p.count(".") + bool(p))
            return f"{name}.{deepest}" if deepest else name
    return name
