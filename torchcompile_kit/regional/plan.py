"""The regional plan: which blocks are compiled, which modules stay eager (data only)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

from torch import nn

from ..diagnostics import compile_failure, grad_modes, was_called

if TYPE_CHECKING:
    from ..diagnostics import CompileMonitor, MonitorRecord

__all__ = [
    "BlockGroup",
    "CompiledGroup",
    "ExpectedShapes",
    "ExtraRegion",
    "GroupReport",
    "PlanReport",
    "Preflight",
    "RegionalPlan",
    "SharedBudget",
    "get_regional_plan",
    "predicted_graphs",
]

PLAN_ATTR = "_torchcompile_kit_plan"
PENDING_ATTR = "_torchcompile_kit_pending"
"""Set on a model while a background compile of it is under way: compiling it again is refused."""


@dataclass(kw_only=True, frozen=True, slots=True)
class CompiledGroup:
    """What compiling one block group produced (the plan's decisions are :class:`BlockGroup`'s
    other fields, made before anything compiled)."""

    region: str
    """The group's marked region (``diagnostics.mark_region``): the measured report credits the
    group with every frame dynamo compiled while one of its blocks' compiled calls ran
    (:meth:`RegionalPlan.report`)."""
    precompile: Any = None
    """With ``compile_regional(..., precompile=True)``: the group's ``PrecompiledRegion``, or
    why it was compiled the usual way (a sentence)."""

    @property
    def path(self) -> str | None:
        """How a restart compiles the group: ``"precompiled (no trace)"``, ``"traced (saved for
        the next restart)"``, why not, or ``None`` without ``precompile=True``."""
        if self.precompile is None or isinstance(self.precompile, str):
            return self.precompile
        return self.precompile.path


@dataclass(kw_only=True, slots=True)
class BlockGroup:
    """Modules of one class compiled with the same settings."""

    class_name: str
    """Name of the blocks' class (``"GPT2Block"``)."""
    names: list[str]
    """Qualified names as in ``model.named_modules()``."""
    selector: str = "discovered"
    """What chose them: ``"declared: _repeated_blocks"`` (the model named them),
    ``"discovered"`` (repeated classes found by ``find_repeated_blocks``) or the ``blocks=``
    selector the user passed."""
    compile_kwargs: dict[str, Any] = field(default_factory=dict)
    """Keyword arguments given to ``module.compile()`` for this group."""
    block_class: type | None = None
    """The blocks' class, set when the plan is made (:func:`plan_regional`)."""
    label: str = ""
    """The group's name in a restart's precompiled regions: the class name, with the group's
    position when two groups share a class."""
    preflight: Preflight | None = None
    """What the guard preflight predicts for the group, set when the plan is made."""
    budget: SharedBudget | None = None
    """The recompile budget the group shares with the groups that run its code object."""
    compiled: CompiledGroup | None = None
    """What compiling it produced; ``None`` until ``compile_regional`` compiled it (a plan from
    ``find_repeated_blocks``)."""

    @property
    def precompile_path(self) -> str | None:
        """:attr:`CompiledGroup.path` (``None`` when not compiled)."""
        return self.compiled.path if self.compiled is not None else None


@dataclass(kw_only=True, frozen=True, slots=True)
class Preflight:
    """What the guard preflight predicts for one block group (a prediction: the measured count is
    the verdict, :meth:`RegionalPlan.report`)."""

    graphs: int
    """Graphs the group needs in training (grad on) for one batch shape, from reading its code
    and its parameters: one per structure, per value of state the code decides on and per
    ``requires_grad`` pattern (frozen and trainable blocks). Times the shapes expected
    (:func:`predicted_graphs`)."""
    eval_graphs: int = 1
    """Graphs it needs on top of those in a ``torch.no_grad()`` evaluation, for one batch shape
    (grad mode is guarded; the parameters' ``requires_grad`` patterns still are)."""
    may_vary: tuple[str, ...] = ()
    """Attributes that differ and are handed on to other functions: each may add graphs (e.g.
    ``self_attn.sliding_window`` on models with alternating attention)."""
    warning: str | None = None
    """The warning the preflight gave (``None`` if it gave none)."""


@dataclass(kw_only=True, frozen=True, slots=True)
class SharedBudget:
    """One dynamo cache for several block classes: they run the same code object (every
    transformers block class runs ``forward_with_checkpointing``), so they share its limit."""

    code: str
    """The code object (``forward_with_checkpointing (file:line)``)."""
    shared_with: tuple[str, ...]
    """The other groups' classes that run it (empty: this group alone)."""
    limit: int
    """The recompile limit in force for it, sized for every group that runs it."""
    needed: int
    """Graphs those groups may need together (training and a no_grad evaluation, for the
    shapes expected)."""
    region_limit: int | None = None
    """The limit the group's marked region raises around its calls: ``limit``, or ``None`` where
    it is the ``recompile_limit=`` the user gave (``torch.compile`` holds it)."""


@dataclass(kw_only=True, frozen=True, slots=True)
class ExpectedShapes:
    """The distinct batch shapes a run will feed, per mode (:func:`expect_shapes`; empty: not
    known, one shape assumed)."""

    train: tuple[tuple[int, ...], ...] = ()
    """Shapes of the training batches (grad on), e.g. ``(batch, length)`` per bucket."""
    evaluation: tuple[tuple[int, ...], ...] = ()
    """Shapes of the evaluation batches (under ``torch.no_grad()``); empty: the training ones."""

    def __bool__(self) -> bool:
        return bool(self.train or self.evaluation)


def predicted_graphs(
    train: int, evaluation: int, expected: ExpectedShapes, dynamic: bool | None
) -> tuple[int, int]:
    """Graphs a region may compile in training and in a ``no_grad`` evaluation: its variants per
    shape (``train``, ``evaluation``: the preflight's counts) times the shapes the run feeds.

    With ``dynamic=False`` each shape is a graph; with ``dynamic=True`` none is; by default
    (``None``: automatic dynamic) the first shape is a static graph and each dimension that then
    changes may add one dynamic graph, so the count is an upper bound. Without expected shapes,
    one shape.

    Example:
        >>> buckets = ExpectedShapes(train=((8, 32), (8, 64), (8, 128)))
        >>> predicted_graphs(1, 1, buckets, dynamic=False)
        (3, 3)
        >>> predicted_graphs(1, 1, buckets, dynamic=None)
        (2, 2)
    """

    def per_mode(variants: int, shapes: Sequence[tuple[int, ...]]) -> int:
        distinct = set(shapes)
        if len(distinct) <= 1 or dynamic:
            return variants
        if dynamic is False:
            return variants * len(distinct)
        rank = min(len(shape) for shape in distinct)
        changing = sum(len({shape[d] for shape in distinct}) > 1 for d in range(rank))
        return variants * min(len(distinct), 1 + changing)

    return (
        per_mode(train, expected.train),
        per_mode(evaluation, expected.evaluation or expected.train),
    )


@dataclass(kw_only=True, frozen=True, slots=True)
class ExtraRegion:
    """What a recipe compiled beside the block groups (a transformers model's loss), measured as a
    region of its own so the report's rows add up to dynamo's count."""

    label: str
    """``"loss_function (ForCausalLMLoss)"`` (prefixed by the model's path when it is nested)."""
    kind: str
    """``"function"``."""
    region: str
    """Its marked region (``diagnostics.mark_call`` / ``mark_region``)."""


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
    """The largest modules that contain no block: they run eagerly."""
    extra_regions: list[ExtraRegion] = field(default_factory=list)
    """What was compiled beside the blocks (the loss), a report row each."""
    expected: ExpectedShapes = field(default_factory=ExpectedShapes)
    """The batch shapes the run will feed, per mode (:func:`expect_shapes`): the predictions
    and recompile limits are sized for them."""
    dynamic: bool | None = None
    """``compile_regional``'s ``dynamic=`` (how shapes become graphs)."""
    loss_limit: int | None = None
    """The recompile limit of the compiled loss (a region of one variant, for the shapes
    expected), sized by :func:`plan_recompile_limits`; ``None`` before (dynamo's own)."""

    @property
    def blocks(self) -> list[str]:
        """Qualified names of every block that is (or will be) compiled, group by group."""
        return [name for group in self.groups for name in group.names]

    def summary(self) -> str:
        """One line: ``compiled 12 × GPT2Block; eager: transformer.wte, lm_head``."""
        compiled = ", ".join(
            f"{len(g.names)} × {g.class_name}"
            + (f" ({g.selector})" if g.selector.startswith("declared") else "")
            for g in self.groups
        )
        line = f"compiled {compiled}"
        line = f"{line}; eager: {', '.join(self.eager) if self.eager else '(none)'}"
        shared: dict[str, list[BlockGroup]] = {}
        for group in self.groups:
            if group.budget and group.budget.shared_with:
                shared.setdefault(group.budget.code, []).append(group)
        for code, groups in shared.items():
            line += (
                f"; {' + '.join(g.class_name for g in groups)} run one code object "
                f"({code.split(' (')[0]}) and share one recompile limit: "
                f"{groups[0].budget.limit} for up to {groups[0].budget.needed} graphs"
            )
        if self.expected:
            train, evaluation = self.expected.train, self.expected.evaluation
            line += (
                f"; expected shapes: {len(train) or 1} in training, "
                f"{len(evaluation or train) or 1} in evaluation"
                + ("" if evaluation else " (assumed: the training ones)")
            )
        return line

    def report(self, monitor: CompileMonitor) -> PlanReport:
        """The measured side of the plan: what each group and the compiled loss really compiled
        under ``monitor``.

        Per row (a marked region, so the rows add up to dynamo's own counts): predicted against
        measured graphs, recompiles with the failed guard, graph breaks, limit hits and compile
        seconds. A row whose compile raised (with the module it was raised in), that compiled
        nothing or more than predicted, broke its graph or hit the limit is flagged; a preflight
        warning dynamo disproved is withdrawn. Returns a :class:`PlanReport`; ``monitor`` is only
        read.

        Example:
            >>> with CompileMonitor() as mon:  # doctest: +SKIP
            ...     model(**batch).loss.backward()
            >>> print(get_regional_plan(model).report(mon))  # doctest: +NORMALIZE_WHITESPACE, +SKIP
            GPT2Block (2 blocks): predicted 1 graph(s), measured 1; 0 recompiles, 0 graph breaks,
            0.41 s  ok
        """
        groups, notes = [], list(monitor.notes)
        for group in self.groups:
            if group.compiled is None:
                groups.append(
                    GroupReport(
                        class_name=group.class_name,
                        blocks=len(group.names),
                        predicted_graphs=group.preflight.graphs if group.preflight else 1,
                        measured=False,
                    )
                )
                notes.append(
                    f"{group.class_name}: not measured per group (a plan that was not "
                    "compiled: find_repeated_blocks; see the monitor's frames)"
                )
                continue
            # what dynamo compiled while the group's blocks ran: their entry frames, the code
            # resumed after breaks, callees compiled as frames of their own
            record = monitor.record_for_region(group.compiled.region)
            groups.append(_group_report(group, record, self))
        # one never called is left out: a base model's loss inside a task model
        groups += [
            _extra_report(e, monitor, self) for e in self.extra_regions if was_called(e.region)
        ]
        return PlanReport(groups=groups, notes=notes)


def _predicted(region: str | None, variants: tuple[int, int], plan: RegionalPlan) -> int:
    """The graphs predicted for the modes the region really ran in (training, ``no_grad``)."""
    train, evaluation = predicted_graphs(*variants, plan.expected, plan.dynamic)
    modes = grad_modes(region) if region is not None else frozenset()
    if not modes:
        return train
    return train * (True in modes) + evaluation * (False in modes)


def _group_report(group: BlockGroup, record: MonitorRecord, plan: RegionalPlan) -> GroupReport:
    preflight = group.preflight  # set with block_class by compile_regional
    graphs = record.counts.graphs
    region = group.compiled.region
    predicted = _predicted(region, (preflight.graphs, preflight.eval_graphs), plan)
    precompiled = (group.precompile_path or "").startswith("precompiled")
    nothing = (
        None
        if precompiled
        else (
            "compiled nothing: the blocks ran eagerly (not called while "
            "the monitor recorded, or dynamo skipped them)"
        )
    )
    withdrawn = None
    if preflight.warning and 0 < graphs < predicted:
        # the preflight read the code and warned; dynamo made fewer graphs: the report takes it
        # back, so the warning does not stand uncorrected
        withdrawn = (
            f"{group.class_name}: the preflight's warning ({predicted} graphs predicted) "
            f"is withdrawn: dynamo compiled {graphs} graph(s) for the group"
        )
    return _fill_measured(
        record,
        region,
        predicted,
        where="the blocks or their callees",
        nothing=nothing,
        row=GroupReport(
            class_name=group.class_name,
            blocks=len(group.names),
            predicted_graphs=predicted,
            withdrawn=withdrawn,
            shares_budget_with=list(group.budget.shared_with) if group.budget else [],
            precompile=group.precompile_path,
        ),
    )


def _extra_report(extra: ExtraRegion, monitor: Any, plan: RegionalPlan) -> GroupReport:
    """An extra region's row: a graph per shape expected and per grad mode it ran in."""
    record = monitor.record_for_region(extra.region)
    predicted = _predicted(extra.region, (1, 1), plan)
    row = GroupReport(class_name=extra.label, blocks=0, kind=extra.kind, predicted_graphs=predicted)
    return _fill_measured(
        record, extra.region, predicted, where=f"the {extra.kind}", nothing=None, row=row
    )


def _fill_measured(
    record: MonitorRecord,
    region: str | None,
    predicted: int,
    *,
    where: str,
    nothing: str | None,
    row: GroupReport,
) -> GroupReport:
    """``row`` with its measured fields filled from ``record``, its flags included: a compile that
    raised, ``nothing`` (when given) for no graph, more graphs than ``predicted``, breaks inside
    ``where``, limit hits."""
    counts = record.counts
    failure = compile_failure(region)
    flags = []
    if failure is not None:
        flags.append(f"failed to compile: {failure}")
    elif nothing is not None and counts.graphs == 0:
        flags.append(nothing)
    elif counts.graphs > predicted:
        flags.append(f"{counts.graphs} graphs where {predicted} were predicted")
    if counts.graph_breaks:
        flags.append(f"{counts.graph_breaks_met} graph break(s) inside {where}")
    if counts.recompile_limit_hits:
        flags.append("hit the recompile limit: later variants run eagerly")
    row.graphs, row.frames = counts.graphs, counts.frames
    row.recompiles = [r.guard for r in record.recompiles]
    row.graph_breaks = [f"{b.location}: {b.reason}" for b in record.graph_breaks]
    row.graph_break_count = counts.graph_breaks_met
    row.limit_hits = [str(h.last_reason) for h in record.limit_hits]
    row.compile_seconds = counts.compile_seconds
    row.flags = flags
    row.failure = str(failure) if failure is not None else None
    return row


@dataclass(kw_only=True, slots=True)
class GroupReport:
    """What one block group compiled, measured (see :meth:`RegionalPlan.report`)."""

    class_name: str
    """The blocks' class, or an extra region's label (:class:`ExtraRegion`)."""
    blocks: int
    """How many blocks the group has; 0 for an extra region's row."""
    kind: str = "blocks"
    """``"blocks"``, or an extra region's kind: ``"function"`` (the loss)."""
    predicted_graphs: int
    """The preflight's prediction."""
    measured: bool = True
    """``False`` for a group that was not compiled block by block (no per-group record)."""
    graphs: int = 0
    """Graphs dynamo compiled while the group's blocks ran (forward graphs; a restarted
    analysis counts once)."""
    frames: int = 0
    """Frames dynamo compiled for the group (entry frames, resumed code, callees)."""
    recompiles: list[str] = field(default_factory=list)
    """The failed guard of each recompile, in ``TORCH_LOGS=recompiles`` words. Where block
    classes share one code object, the first compile of the second class is one of these."""
    graph_breaks: list[str] = field(default_factory=list)
    """``file:line: reason`` of each distinct break inside the blocks or their callees."""
    graph_break_count: int = 0
    """How often a graph break was met (dynamo's ``counters["graph_break"]`` counts this)."""
    limit_hits: list[str] = field(default_factory=list)
    """The last failing guard of each recompile-limit hit."""
    compile_seconds: float = 0.0
    """Forward and backward compile seconds of the group."""
    flags: list[str] = field(default_factory=list)
    """What needs a look; empty when the group compiled as predicted."""
    withdrawn: str | None = None
    """The preflight warned, and dynamo compiled fewer graphs than it predicted: the warning is
    withdrawn."""
    shares_budget_with: list[str] = field(default_factory=list)
    """Other groups sharing the blocks' code object and so the recompile limit."""
    precompile: str | None = None
    """:attr:`BlockGroup.precompile_path` when the report was made."""
    failure: str | None = None
    """The compile that raised in the group's calls: ``"Unsupported: ... (raised in
    encoder.0.gate, file:line)"`` (the error itself propagated to the caller)."""


@dataclass(kw_only=True, slots=True)
class PlanReport:
    """The measured side of a :class:`RegionalPlan`, per group."""

    groups: list[GroupReport]
    """One report per block group, then one per extra region that ran (the
    loss): together, everything the recipe compiled, so their graphs add up to dynamo's count."""
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
            if not g.measured:
                verdict = "not measured per group"
            what = f"{g.blocks} blocks" if g.kind == "blocks" else g.kind
            lines.append(
                f"{g.class_name} ({what}): predicted {g.predicted_graphs} "
                f"graph(s), measured {g.graphs}; {len(g.recompiles)} recompiles, "
                f"{g.graph_break_count} graph breaks, {g.compile_seconds:.2f} s  "
                f"{verdict}"
            )
            if g.precompile:
                lines.append(f"    restart: {g.precompile}")
            if g.withdrawn:
                lines.append(f"    {g.withdrawn.split(': ', 1)[1]}")
            if g.shares_budget_with and g.recompiles:
                lines.append(
                    "    shares its code object and recompile limit with "
                    f"{', '.join(g.shares_budget_with)}: the first compile of one class "
                    "counts as a recompile of the other's code"
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
