"""The candidate recipes ``tune`` measures, each a row of the bench's recipe table.

A :class:`Candidate` names the bench recipe that runs it (in its own fresh process, through
:func:`torchcompile_kit.bench.run_recipe_isolated`), the compiled code it shares with other
candidates (one correctness check serves all of them: ``full-warm`` runs the kernels ``full``
compiled), and what the user must copy to apply it (:mod:`.report` writes the snippet).

Order matters: eager first (every other candidate is compared with it), then the cheapest compiles,
so that a small budget or a short run prunes the expensive ones, and the warm restarts last (they
load the cache their cold recipe saved).
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
    """Key of the compiled code it runs: one correctness check per key (``None``: eager)."""
    optimizer: Literal["adam", "compiled", "fused"] = "adam"
    """The optimizer: eager Adam (default implementation), ``compile_optimizer`` or fused Adam."""
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
        name="eager-longest",
        recipe="eager-longest",
        kind="eager",
        captioner_only=True,
        description="no compile, captions padded to the batch's longest",
    ),
    Candidate(
        name="regional",
        recipe="regional",
        kind="regional",
        gate="regional",
        description="compile_regional: each repeated block compiled once, reused",
    ),
    Candidate(
        name="nested",
        recipe="nested",
        kind="nested",
        gate="nested",
        description="one full compile with blocks as nested compile regions (torch >= 2.8)",
    ),
    Candidate(
        name="full",
        recipe="full",
        kind="full",
        gate="full",
        description="model.compile() after fix_loss_function",
    ),
    Candidate(
        name="full+compile_optimizer",
        recipe="compile-optimizer",
        kind="full",
        gate="full",
        optimizer="compiled",
        description="full compile + compile_optimizer(Adam)",
    ),
    Candidate(
        name="full+fused_adam",
        recipe="fused-adam",
        kind="full",
        gate="full",
        optimizer="fused",
        description="full compile + eager Adam(fused=True), the fastest eager optimizer",
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
