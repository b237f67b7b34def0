"""The candidate recipes ``tune`` measures, each a row of the bench's recipe table.

A :class:`Candidate` names the bench recipe that runs it (in its own fresh process, through
:func:`torchcompile_kit.bench.run_recipe_isolated`, which also checks it against eager there),
the compiled code it runs, and what the user must copy to apply it (:mod:`.snippet` writes it).

Order matters, and is decided from what is known before anything is measured, so that a small
budget is spent on the most promising candidates and a short planned run prunes the expensive
ones:

1. ``eager``: every other candidate is compared with it, and its run is the cheapest;
2. ``regional`` before ``full``: it compiles each repeated block once, so its compile is the
   shortest of the compiled recipes (and grows least with depth), for a step close to ``full``'s;
3. ``full``, then the candidates that cost about one more compile on top of it, cheapest first:
   the same graph with a fused eager optimizer, then a compiled optimizer, then a dynamic graph;
   ``eager-longest`` (captioner only) sits among them as a run without a compile;
4. ``nested`` (a full compile plus regions), then ``buckets`` (every bucket shape compiled up
   front: the most compiles);
5. the warm restarts last: they load the cache their cold recipe saved.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

__all__ = ["CANDIDATES", "Candidate", "candidate_names"]

Kind = Literal["eager", "full", "regional", "nested", "buckets"]


@dataclass(kw_only=True, slots=True, frozen=True)
class Candidate:
    """One way to run the user's training, as ``tune`` measures and recommends it."""

    name: str
    """Name in the table and in ``tune.json`` (``"regional"``)."""
    recipe: str
    """The bench recipe that runs it (``torchcompile_kit.bench.RECIPES``)."""
    kind: Kind
    """How the model is compiled (selects the snippet)."""
    description: str
    """One line for the table."""
    gate: str | None = None
    """The compiled model code it runs (``"full"`` for every whole-model compile), checked in its
    own run (:mod:`.gate`); ``None``: eager, nothing to check."""
    optimizer: Literal["adam", "compiled", "fused"] = "adam"
    """The run's optimizer (the ``--model`` spec's, else ``Adam(lr=1e-4)``): as it is, under
    ``compile_optimizer``, or rebuilt with ``fused=True`` (Adam/AdamW)."""
    dynamic: Literal["default", "mark", "static"] = "default"
    """Shapes: ``torch.compile`` default, ``mark_dynamic_batch`` on every batch, or
    ``dynamic=False`` with every bucket shape compiled up front."""
    restart: bool = False
    """A warm restart (loads the compile cache a previous run saved): ranked for the planned run
    only with ``warm_start=True``; otherwise shown as what a restart would cost."""
    captioner_only: bool = False
    """Differs from another candidate only in how the bench pads the captioner's captions."""


CANDIDATES: tuple[Candidate, ...] = (
    Candidate(name="eager", recipe="eager", kind="eager", description="no compile (the baseline)"),
    Candidate(
        name="regional",
        recipe="regional",
        kind="regional",
        gate="regional",
        description="compile_regional: each repeated block compiled once, reused",
    ),
    Candidate(
        name="full",
        recipe="full",
        kind="full",
        gate="full",
        description="model.compile() after fix_loss_function",
    ),
    Candidate(
        name="eager-longest",
        recipe="eager-longest",
        kind="eager",
        captioner_only=True,
        description="no compile, captions padded to the batch's longest",
    ),
    Candidate(
        name="full+fused_adam",
        recipe="fused-adam",
        kind="full",
        gate="full",
        optimizer="fused",
        description="full compile + the run's Adam/AdamW with fused=True (fastest eager)",
    ),
    Candidate(
        name="full+compile_optimizer",
        recipe="compile-optimizer",
        kind="full",
        gate="full",
        optimizer="compiled",
        description="full compile + compile_optimizer(the run's optimizer, Adam by default)",
    ),
    Candidate(
        name="mark-dynamic",
        recipe="mark-dynamic",
        kind="full",
        gate="full",
        dynamic="mark",
        description="full compile, pad to longest + mark_dynamic_batch (one dynamic graph)",
    ),
    Candidate(
        name="nested",
        recipe="nested",
        kind="nested",
        gate="nested",
        description="one full compile with blocks as nested compile regions",
    ),
    Candidate(
        name="buckets",
        recipe="buckets",
        kind="buckets",
        gate="full",
        dynamic="static",
        description="plan_buckets from your lengths + BucketBatchSampler, dynamic=False",
    ),
    Candidate(
        name="full-warm",
        recipe="full-warm",
        kind="full",
        gate="full",
        restart=True,
        description="full compile, restarted with the compile cache 'full' saved",
    ),
    Candidate(
        name="regional-warm",
        recipe="regional-warm",
        kind="regional",
        gate="regional",
        restart=True,
        description="compile_regional, restarted with its saved compile cache",
    ),
)
"""Every candidate, in the order ``tune`` runs them."""


def candidate_names() -> list[str]:
    """The candidates' names, in run order.

    Example:
        >>> candidate_names()[0]
        'eager'
    """
    return [candidate.name for candidate in CANDIDATES]
