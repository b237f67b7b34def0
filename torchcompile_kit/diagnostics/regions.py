"""Compiled regions: which region's call dynamo was compiling when it compiled a frame.

Code objects say little about who compiled them (transformers runs every block through one
wrapper), but every frame dynamo compiles for a region is compiled while the region's call is on
the stack; so the call sets a context variable while it runs, and :class:`CompileMonitor` tags
frames, breaks, recompiles and limit hits with the innermost region (docs/diagnostics.md).
"""

from __future__ import annotations

import itertools
import logging
import time
from collections.abc import Callable, Iterable
from contextvars import ContextVar
from typing import Any

import torch
from torch import nn

from .. import _dynamo

__all__ = ["current_region", "mark_region"]

logger = logging.getLogger(__name__)

_CURRENT: ContextVar[str | None] = ContextVar("torchcompile_kit_region", default=None)
_NUMBERS = itertools.count()


def current_region() -> str | None:
    """The label of the innermost marked region running now, or ``None``.

    Example:
        >>> current_region() is None
        True
    """
    return _CURRENT.get()


def mark_region(modules: Iterable[nn.Module], label: str) -> str:
    """Tag every compile inside these compiled modules' calls with one region; returns its id (the
    key for :meth:`CompileMonitor.record_for_region`).

    Call it after ``module.compile()``: each compiled call is wrapped to set :func:`current_region`
    while it runs (stepping aside under an outer compile); ``uncompile`` removes it. The first call
    of each module is logged at INFO before and after, with its seconds. ``label`` is readable (the
    group's class name); uncompiled modules are skipped.

    Example:
        >>> region = mark_region(blocks, "GPT2Block")  # doctest: +SKIP
        >>> monitor.record_for_region(region)["counts"]["graphs"]  # doctest: +SKIP
        1
    """
    region = f"{label}#{next(_NUMBERS)}"
    for module in modules:
        compiled = _dynamo.get_compiled_call(module)
        if compiled is not None:
            _dynamo.set_compiled_call(module, _in_region(compiled, region))
    return region


def _in_region(call: Callable[..., Any], region: str) -> Callable[..., Any]:
    first = [True]  # per module: its first call is where a cold compile stalls the loop

    def run(*args: Any, **kwargs: Any) -> Any:
        if torch.compiler.is_compiling():  # traced by an outer compile: be transparent
            return call(*args, **kwargs)
        token = _CURRENT.set(region)
        try:
            if not first[0]:
                return call(*args, **kwargs)
            first[0] = False
            logger.info("%s: first compiled call: dynamo compiles it now (minutes for a large "
                        "block with inductor on CPU) ...", region)
            start = time.perf_counter()
            result = call(*args, **kwargs)
            logger.info("%s: first compiled call done in %.1f s (the backward compiles at the "
                        "first backward())", region, time.perf_counter() - start)
            return result
        finally:
            _CURRENT.reset(token)

    return run
