"""The recipes ``tune`` measures (names of ``bench.RECIPES`` rows), most promising first: eager, the
shortest compiles, one-more-compile variants and ``buckets``, then warm restarts and
the background compile (after ``regional``, whose compiled step it reuses).
"""

from __future__ import annotations

__all__ = ["CANDIDATES"]

CANDIDATES: tuple[str, ...] = (
    "eager",
    "regional",
    "full",
    "eager-longest",
    "fused-adam",
    "compile-optimizer",
    "mark-dynamic",
    "buckets",
    "full-warm",
    "regional-warm",
    "regional-background",
)
"""The recipes ``tune`` considers, in the order it runs them (each a key of the bench's
``RECIPES``)."""
