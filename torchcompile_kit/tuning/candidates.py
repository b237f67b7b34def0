"""The recipes ``tune`` measures, by name, in the order it runs them.

A candidate *is* a row of the bench's recipe table (``torchcompile_kit.bench.RECIPES``): the
bench runs it (in its own fresh process, through :func:`torchcompile_kit.bench.run_recipe_isolated`,
which also checks it against eager there), and the snippet prints the same setup lines
(``torchcompile_kit.bench.setup_source``). A recipe that compiles is checked (:mod:`.gate`); one
with ``cache_from`` is a warm restart.

Order matters, and is decided from what is known before anything is measured, so that a small
budget is spent on the most promising candidates and a short planned run prunes the expensive
ones:

1. ``eager``: every other candidate is compared with it, and its run is the cheapest;
2. ``regional`` before ``full``: it compiles each repeated block once, so its compile is the
   shortest of the compiled recipes (and grows least with depth), for a step close to ``full``'s;
3. ``full``, then the candidates that cost about one more compile on top of it, cheapest first:
   the same graph with a fused eager optimizer (``fused-adam``), then a compiled optimizer, then a dynamic graph;
   ``eager-longest`` (captioner only) sits among them as a run without a compile;
4. ``nested`` (a full compile plus regions), then ``buckets`` (every bucket shape compiled up
   front: the most compiles);
5. the warm restarts last: they load the cache their cold recipe saved.
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
    "nested",
    "buckets",
    "full-warm",
    "regional-warm",
)
"""The recipes ``tune`` considers, in the order it runs them (each a key of the bench's ``RECIPES``)."""
