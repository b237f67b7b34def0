"""Compiled regions: which region's call dynamo was compiling when it compiled a frame.

dynamo records a frame by its code object, and code says little about *who* compiled it: every
transformers block class runs through one wrapper (``forward_with_checkpointing``), a block whose
``forward`` holds no op of its own leaves no source line of its ``forward`` in the graph, and a
graph break inside a callee makes dynamo compile the callee's frame (and the code resumed after
the break) as frames of their own. What is certain is *when*: every frame dynamo compiles for a
region is compiled while the region's compiled call is on the stack. So a region's compiled call
is wrapped to set a context variable while it runs, and :class:`CompileMonitor` tags every frame
(with its graphs, breaks and recompile) and every recompile-limit hit with the innermost region
running when torch reported it. Backward graphs are compiled later, at ``backward()``, and go with
their forward frame by compile id.
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
    """Tag every compile that happens inside these compiled modules' calls with one region.

    Call it after ``module.compile()`` (or ``compile_in_place``): each module's compiled call is
    wrapped so that, while it runs, :func:`current_region` returns the region's id. Under an
    outer ``torch.compile`` the wrapper steps aside (``torch.compiler.is_compiling()``), so dynamo
    never traces it. ``uncompile`` removes it with the compiled call. The first call of each
    module (where its cold compile stalls the loop) is logged at INFO before it starts and with
    its seconds after it ends (logger ``torchcompile_kit.diagnostics.regions``).

    Args:
        modules: compiled modules (one block group); an uncompiled one is skipped.
        label: a readable name (the group's class name); the id adds a number to keep two
            groups of one class apart.

    Returns:
        The region's id, the key for :meth:`CompileMonitor.record_for_region`.

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
