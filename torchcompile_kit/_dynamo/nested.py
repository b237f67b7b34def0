"""Nested compile regions (``compile_regional(nested=True)``).

Part of the one door to torch's private compiler APIs (see ``_dynamo/__init__.py``)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import nn


__all__ = ["has_nested_compile_region", "mark_nested_region"]


# --- nested compile regions (compile_regional(nested=True)) ----------------------------------
# Why: the hybrid mode compiles the whole model once with each block's forward marked as a nested
# compile region, so dynamo traces the block once and reuses it (an `invoke_subgraph` HOP) inside
# one whole-model graph. `torch.compiler.nested_compile_region` is public (torch >= 2.8); it sets
# marker attributes on the function it wraps, so it must wrap the class's plain `forward` function
# (a bound method takes no attributes) and blocks share one cache key through it.
# Upstream: https://github.com/pytorch/pytorch/pull/137538 (invoke_subgraph HOP). The probe can go
# when torch >= 2.8 is the floor.


def has_nested_compile_region() -> bool:
    """Whether ``torch.compiler.nested_compile_region`` exists (torch >= 2.8)."""
    return hasattr(torch.compiler, "nested_compile_region")


def mark_nested_region(modules: list[nn.Module]) -> Callable[[], None]:
    """Make each module's ``forward`` a nested compile region shared by its class; return the undo.

    One marked function per class (``nested_compile_region(type(m).forward)``) is bound to every
    instance as an instance attribute, so instances of a class reuse one traced subgraph; the
    class itself is not changed.
    """
    import types

    marked: dict[type, Callable[..., Any]] = {}
    for module in modules:
        cls = type(module)
        if cls not in marked:
            marked[cls] = torch.compiler.nested_compile_region(cls.forward)
        module.forward = types.MethodType(marked[cls], module)

    def undo() -> None:
        for module in modules:
            module.__dict__.pop("forward", None)

    return undo
