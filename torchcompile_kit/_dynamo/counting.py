"""Counting frames and recompile-limit hits.

Part of the one door to torch's private compiler APIs (see ``_dynamo/__init__.py``)."""

from __future__ import annotations

from typing import Any

__all__ = ["frame_counting_backend", "recompile_limit_hits"]


# --- counting -------------------------------------------------------------------------------
# Why: a benchmark row must say how many graphs dynamo really compiled and whether the recompile
# limit dropped a frame to eager. Upstream: `torch._dynamo.testing.CompileCounter` and
# `torch._dynamo.utils.counters` are testing/debug aids with no public twin; CompileMonitor
# (diagnostics) reads the structured trace instead. Can go when torch.compiler exposes counts.


def frame_counting_backend() -> Any:
    """A backend that counts frames (``.frame_count``) and runs the graph eagerly."""
    from torch._dynamo.testing import CompileCounter

    return CompileCounter()


def recompile_limit_hits() -> int:
    """How often dynamo gave up on a frame at the recompile limit since the last reset."""
    from torch._dynamo.utils import counters

    return sum(n for key, n in counters["unimplemented"].items() if "recompile_limit" in key)
