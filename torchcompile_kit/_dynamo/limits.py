"""The recompile limit under its name for each torch, and the per-call compile keywords.

Part of the one door to torch's private compiler APIs (see ``_dynamo/__init__.py``)."""

from __future__ import annotations

import contextlib
import inspect
from collections.abc import Callable, Iterator
from typing import Any

import torch

__all__ = [
    "isolated_cache_kwarg",
    "recompile_limit",
    "recompile_limit_at_least",
    "recompile_limit_kwarg",
]


# --- the recompile limit --------------------------------------------------------------------
# Why: a block class, a shape or an adapter state gets `recompile_limit` graphs per code object;
# past it dynamo runs the frame eagerly and says so once. Helpers size their work against it.
# `torch._dynamo.config.recompile_limit` is a private config (no public way to read it).


def recompile_limit() -> int:
    """Dynamo's per-code-object recompile limit (8 by default)."""
    return int(torch._dynamo.config.recompile_limit)


@contextlib.contextmanager
def recompile_limit_at_least(limit: int) -> Iterator[None]:
    """Raise dynamo's recompile limit to ``limit`` while the block runs (never lower it).

    Why: a compiled region whose graphs are known (a block per bucket shape, in training and in
    evaluation) needs a limit sized for them, raised only while its own calls run, on every torch
    of the window and also after it was compiled (``torch.compile(recompile_limit=)`` is fixed at
    compile time and missing before torch 2.13). Dynamo reads ``config.recompile_limit`` when it
    compiles a frame, inside the call; a per-call ``recompile_limit=`` given to ``torch.compile``
    still wins for its frames. Upstream: ``torch._dynamo.config.recompile_limit`` (private config,
    no public setter; https://github.com/pytorch/pytorch/blob/main/torch/_dynamo/config.py). Can
    go when torch takes a limit per region that can be changed after compile.

    Example:
        >>> with recompile_limit_at_least(16):
        ...     recompile_limit() >= 16
        True
    """
    config = torch._dynamo.config
    before = config.recompile_limit
    if limit <= before:
        yield
        return
    config.recompile_limit = limit
    try:
        yield
    finally:
        config.recompile_limit = before


def recompile_limit_kwarg(compile_fn: Callable[..., Any] | None = None) -> str | None:
    """The ``torch.compile`` keyword that sets the limit for one compile call, or ``None``.

    ``compile_fn`` stands in for ``torch.compile`` (tests switch the probe with it).

    Why: raising the limit for one block group must not raise it globally. Upstream:
    ``torch.compile(..., recompile_limit=)`` came with
    https://github.com/pytorch/pytorch/pull/177936 (2026); where it is missing the caller warns
    instead. Can go when every supported torch has it.
    """
    params = inspect.signature(compile_fn or torch.compile).parameters
    return "recompile_limit" if "recompile_limit" in params else None


def isolated_cache_kwarg(compile_fn: Callable[..., Any] | None = None) -> dict[str, bool]:
    """``{"isolate_recompiles": True}`` where ``torch.compile`` takes it, else ``{}``.

    ``compile_fn`` stands in for ``torch.compile`` (tests switch the probe with it).

    Why: a frame of ours shared by several compiled regions (torch.nn modules, which dynamo will
    not trace as a top-level frame) must not share one recompile budget across them. Upstream:
    ``torch.compile(isolate_recompiles=)`` came with https://github.com/pytorch/pytorch/pull/178351
    (2026); without it the regions share one budget and may recompile up to the limit. Can go when
    every supported torch has it.
    """
    params = inspect.signature(compile_fn or torch.compile).parameters
    return {"isolate_recompiles": True} if "isolate_recompiles" in params else {}
