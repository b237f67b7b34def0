"""Nested compile regions (``compile_regional(nested=True)``).

Part of the one door to torch's private compiler APIs (see ``_dynamo/__init__.py``)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import nn

__all__ = ["mark_nested_region"]


# --- nested compile regions (compile_regional(nested=True)) ----------------------------------
# Why: the hybrid mode compiles the whole model once with each block's forward marked as a nested
# compile region, so dynamo traces the block once and reuses it (an `invoke_subgraph` HOP) inside
# one whole-model graph. `torch.compiler.nested_compile_region` is public; it sets
# marker attributes on the function it wraps, so it wraps the class's plain `forward` function
# (a bound method takes no attributes), once per class, so blocks share one cache key through it.
#
# The module goes to the marked function as an explicit argument (a per-class trampoline bound to
# each instance), never as the `__self__` of a method bound to the marked function itself. Since
# torch 2.14, dynamo decides whether a traced region can be reused for the next block by remapping
# the sources of the region's *arguments* (`_dynamo/variables/invoke_subgraph.py`, `is_reusable`:
# guards on `h[0].weight` are re-checked as `h[1].weight`). Dynamo inlines an instance-level bound
# method as `__func__(self, ...)` with `self` sourced through `forward.__self__`, which that remap
# does not follow: measured on 2.14.1 and 2.15.0, every block then ran with block 0's weights
# (logits off by 0.21 on a 3-layer GPT-2, block 1-2 gradients None). With `self` as an argument
# of the call to the marked function, the remap is exact and the region is still traced once
# (2.13.0, 2.14.1, 2.15.0: logits and gradients equal to eager, one subgraph called 3 times;
# tests/regional/test_nested.py). Upstream: https://github.com/pytorch/pytorch/pull/137538
# (invoke_subgraph HOP); torch's own docs decorate the class's `forward`, which also passes `self`
# as an argument.


def mark_nested_region(modules: list[nn.Module]) -> Callable[[], None]:
    """Make each module's ``forward`` a nested compile region shared by its class; return the undo.

    One marked function per class (``nested_compile_region(type(m).forward)``) is called by a
    per-class trampoline bound to every instance as its ``forward``, with the module as an explicit
    argument (see the comment above for why), so instances of a class reuse one traced subgraph
    with their own weights; the class itself is not changed.
    """
    import types

    trampolines: dict[type, Callable[..., Any]] = {}
    for module in modules:
        cls = type(module)
        if cls not in trampolines:
            trampolines[cls] = _region_trampoline(torch.compiler.nested_compile_region(cls.forward))
        module.forward = types.MethodType(trampolines[cls], module)

    def undo() -> None:
        for module in modules:
            module.__dict__.pop("forward", None)

    return undo


def _region_trampoline(marked: Callable[..., Any]) -> Callable[..., Any]:
    """A plain function that calls ``marked`` with the module as its first argument."""

    def region_forward(self: nn.Module, *args: Any, **kwargs: Any) -> Any:
        return marked(self, *args, **kwargs)

    return region_forward
