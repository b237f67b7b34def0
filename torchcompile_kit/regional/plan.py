"""The regional plan: which blocks are compiled, which modules stay eager (data only).

Also the one undo registry: everything a helper installs next to an in-place compile (the
``use_cache`` hook, the pinned loss, ``compile_peft``'s runtime checks) registers how to remove it
with :func:`register_undo`, and :func:`~torchcompile_kit.uncompile` runs them in reverse.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

from torch import nn

if TYPE_CHECKING:
    from ..diagnostics import CompileMonitor

__all__ = [
    "BlockGroup",
    "GroupReport",
    "PlanReport",
    "RegionalPlan",
    "get_regional_plan",
    "register_undo",
    "run_undo",
]

PLAN_ATTR = "_torchcompile_kit_plan"
UNDO_ATTR = "_torchcompile_kit_undo"


@dataclass(kw_only=True, slots=True)
class BlockGroup:
    """Modules of one class compiled with the same settings."""

    class_name: str
    """Name of the blocks' class (``"GPT2Block"``)."""
    names: list[str]
    """Qualified names as in ``model.named_modules()``."""
    selector: str = "auto"
    """What chose them: ``"auto"`` (discovery) or the ``blocks=`` selector's repr."""
    compile_kwargs: dict[str, Any] = field(default_factory=dict)
    """Keyword arguments given to ``module.compile()`` for this group."""
    predicted_graphs: int = 1
    """Graphs the guard preflight predicts from reading the code (one per block structure and
    per value of state the code uses); set by ``compile_regional``. A prediction: the measured
    count is the verdict."""
    may_vary: list[str] = field(default_factory=list)
    """Attributes that differ between blocks and are handed on to other functions: each *may*
    add graphs (e.g. ``self_attn.sliding_window`` on models with alternating attention)."""
    block_class: type | None = None
    """The blocks' class, set by ``compile_regional``; the measured report attributes compiled
    frames to it (:meth:`RegionalPlan.report`)."""


@dataclass(kw_only=True, slots=True)
class RegionalPlan:
    """What ``compile_regional`` compiles and what stays eager.

    Example:
        >>> plan = find_repeated_blocks(model)  # doctest: +SKIP
        >>> plan.summary()  # doctest: +SKIP
        'compiled 12 × GPT2Block; eager: transformer.wte, transformer.wpe, ...'
    """

    groups: list[BlockGroup]
    """Blocks to compile, grouped by class (and by selector when ``blocks=`` is a mapping)."""
    eager: list[str]
    """The largest modules that contain no block: they run eagerly (unless ``remainder=True``)."""
    remainder: list[str] = field(default_factory=list)
    """Eager modules compiled as their own regions (``compile_regional(..., remainder=True)``)."""

    @property
    def blocks(self) -> list[str]:
        """Qualified names of every block that is (or will be) compiled, group by group."""
        return [name for group in self.groups for name in group.names]

    def summary(self) -> str:
        """One line: ``compiled 12 × GPT2Block; eager: transformer.wte, lm_head``."""
        compiled = ", ".join(f"{len(g.names)} × {g.class_name}" for g in self.groups)
        line = f"compiled {compiled}"
        if self.remainder:
            line += f"; also compiled: {', '.join(self.remainder)}"
        eager = [name for name in self.eager if name not in self.remainder]
        return f"{line}; eager: {', '.join(eager) if eager else '(none)'}"

    def report(self, monitor: CompileMonitor) -> PlanReport:
        """The measured side of the plan: what each group really compiled under ``monitor``.

        Run the first step(s) under a :class:`~torchcompile_kit.CompileMonitor`, then ask. Per
        group: graphs compiled (against the preflight's prediction), recompiles with the failed
        guard, graph breaks inside the blocks, recompile-limit hits and compile seconds. A group
        that compiled nothing, more graphs than predicted, broke its graph or hit the limit is
        flagged; the prediction stays a prediction, the flags are measured.

        Args:
            monitor: a monitor that was recording while the model ran (running or stopped).

        Returns:
            A :class:`PlanReport` (``str()`` or ``.summary()`` for a table, ``.as_dict()``).

        Example:
            >>> model = compile_regional(model, backend="aot_eager")  # doctest: +SKIP
            >>> with CompileMonitor() as mon:  # doctest: +SKIP
            ...     model(**batch).loss.backward()
            >>> print(get_regional_plan(model).report(mon))  # doctest: +SKIP
            GPT2Block: 1 graph (predicted 1), 0 recompiles, 0 graph breaks, 0.41 s  ok
        """
        classes = [g.block_class for g in self.groups if g.block_class is not None]
        monitor.attribute(*classes)
        groups, notes = [], list(monitor.notes)
        for group in self.groups:
            if group.block_class is None:
                groups.append(
                    GroupReport(
                        class_name=group.class_name,
                        blocks=len(group.names),
                        predicted_graphs=group.predicted_graphs,
                    )
                )
                notes.append(
                    f"{group.class_name}: not measured per group (a plan that was not compiled "
                    "block by block: find_repeated_blocks, or compile_regional(nested=True), whose "
                    "blocks are part of one whole-model graph; see the monitor's frames)"
                )
                continue
            record = monitor.record_for(group.block_class)
            counts, breaks = record["counts"], record["graph_breaks"]
            flags = []
            if counts["graphs"] == 0:
                flags.append(
                    "compiled nothing: the blocks ran eagerly (not called while the monitor "
                    "recorded, or dynamo skipped them)"
                )
            elif counts["graphs"] > group.predicted_graphs:
                predicted = group.predicted_graphs
                flags.append(f"{counts['graphs']} graphs where {predicted} were predicted")
            if counts["graph_breaks"]:
                flags.append(f"{counts['graph_breaks']} graph break(s) inside the block")
            if counts["recompile_limit_hits"]:
                flags.append("hit the recompile limit: later variants run eagerly")
            groups.append(
                GroupReport(
                    class_name=group.class_name,
                    blocks=len(group.names),
                    predicted_graphs=group.predicted_graphs,
                    graphs=counts["graphs"],
                    recompiles=[r["guard"] for r in record["recompiles"]],
                    graph_breaks=[f"{b['location']}: {b['reason']}" for b in breaks],
                    limit_hits=[str(h["last_reason"]) for h in record["limit_hits"]],
                    compile_seconds=counts["compile_seconds"],
                    flags=flags,
                )
            )
        return PlanReport(groups=groups, notes=notes)


@dataclass(kw_only=True, slots=True)
class GroupReport:
    """What one block group compiled, measured (see :meth:`RegionalPlan.report`)."""

    class_name: str
    """The blocks' class."""
    blocks: int
    """How many blocks the group has."""
    predicted_graphs: int
    """The preflight's prediction."""
    graphs: int = 0
    """Graphs compiled for the group while the monitor recorded (forward graphs)."""
    recompiles: list[str] = field(default_factory=list)
    """The failed guard of each recompile, in ``TORCH_LOGS=recompiles`` words."""
    graph_breaks: list[str] = field(default_factory=list)
    """``file:line: reason`` of each distinct break inside the blocks."""
    limit_hits: list[str] = field(default_factory=list)
    """The last failing guard of each recompile-limit hit."""
    compile_seconds: float = 0.0
    """Forward and backward compile seconds of the group."""
    flags: list[str] = field(default_factory=list)
    """What needs a look; empty when the group compiled as predicted."""


@dataclass(kw_only=True, slots=True)
class PlanReport:
    """The measured side of a :class:`RegionalPlan`, per group."""

    groups: list[GroupReport]
    """One report per block group."""
    notes: list[str] = field(default_factory=list)
    """What the monitor could not see."""

    @property
    def flagged(self) -> list[GroupReport]:
        """The groups with at least one flag."""
        return [g for g in self.groups if g.flags]

    def summary(self) -> str:
        """One line per group, then its recompiles and breaks."""
        lines = []
        for g in self.groups:
            verdict = "; ".join(g.flags) if g.flags else "ok"
            lines.append(
                f"{g.class_name} ({g.blocks} blocks): {g.graphs} graph(s) (predicted "
                f"{g.predicted_graphs}), {len(g.recompiles)} recompiles, {len(g.graph_breaks)} "
                f"graph breaks, {g.compile_seconds:.2f} s  {verdict}"
            )
            lines += [f"    recompiled: {reason}" for reason in g.recompiles]
            lines += [f"    graph break: {where}" for where in g.graph_breaks]
        lines += [f"note: {note}" for note in self.notes]
        return "\n".join(lines)

    def __str__(self) -> str:
        return self.summary()

    def as_dict(self) -> dict[str, Any]:
        """JSON-serialisable."""
        return {"groups": [asdict(g) for g in self.groups], "notes": list(self.notes)}


def get_regional_plan(model: nn.Module) -> RegionalPlan | None:
    """The plan ``compile_regional`` recorded on ``model``, or ``None`` if it was not called.

    Example:
        >>> get_regional_plan(compile_regional(model)).summary()  # doctest: +SKIP
        'compiled 12 × GPT2Block; eager: transformer.wte, transformer.wpe, ...'
    """
    return getattr(model, PLAN_ATTR, None)


def register_undo(model: nn.Module, undo: Callable[[], None]) -> None:
    """Run ``undo`` when :func:`~torchcompile_kit.uncompile` is called on ``model``.

    For helpers that install something next to an in-place compile (hooks, wrapped methods).
    Undos run in reverse order of registration.

    Example:
        >>> handle = model.register_forward_pre_hook(hook)  # doctest: +SKIP
        >>> register_undo(model, handle.remove)  # doctest: +SKIP
    """
    model.__dict__.setdefault(UNDO_ATTR, []).append(undo)


def run_undo(model: nn.Module) -> None:
    """Run and forget every undo registered on ``model``, last first."""
    for undo in reversed(model.__dict__.pop(UNDO_ATTR, [])):
        undo()
