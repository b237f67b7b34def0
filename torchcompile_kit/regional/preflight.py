"""Guard preflight: find per-instance state that would make repeated blocks recompile.

Dynamo specializes on int attributes of modules and guards some per-instance objects by identity
(pytorch#163329), with one recompile budget per code object: a block reading a distinct
``self.layer_idx`` compiles once per layer until the limit, then silently runs eagerly.
"""

from __future__ import annotations

import functools
import inspect
import logging
import warnings
from collections.abc import Hashable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from .. import _dynamo
from ..diagnostics import set_recompile_limit
from .attribute_reads import DECIDES, attribute_uses
from .discovery import BlocksArg, group_blocks
from .plan import BlockGroup, Preflight, RegionalPlan, SharedBudget, predicted_graphs

__all__ = [
    "plan_regional",
    "GuardFinding",
    "Preflight",
    "find_instance_variants",
    "preflight_group",
    "plan_recompile_limits",
    "requires_grad_variants",
    "size_recompile_limits",
]

logger = logging.getLogger(__name__)

_CONSTANT_TYPES = (bool, int, float, str, type(None))

# transformers attention modules read `layer_idx` only to index a KV cache; compile_regional
# disables the cache in forwards that do not generate, so these reads are not traced.
_CACHE_ONLY_ATTRS = frozenset({"layer_idx"})


@dataclass(frozen=True, slots=True)
class GuardFinding:
    """An attribute that differs between instances of a block class and is read by its code."""

    attribute: str
    """Path inside the block (``"attn.layer_idx"``)."""
    kind: str
    """``"constant"`` (dynamo specializes on the value) or ``"object"`` (guarded by identity)."""
    values: tuple[Hashable, ...]
    """The value per instance (``"<object>"`` for objects)."""
    cache_only: bool = False
    """transformers reads it only to index a KV cache (``layer_idx``)."""
    certain: bool = True
    """The code uses the value itself (a branch, arithmetic, an index, a call of it), so each
    value is a graph. ``False`` when it is only handed on as an argument (``f(x=self.window)``):
    whether the callee specializes on it cannot be read here, so the blocks *may* recompile and
    the measured count (``CompileMonitor``) decides."""


def _value_key(value: Any, owner: nn.Module | None = None) -> tuple[str, Hashable] | None:
    if isinstance(value, (torch.Tensor, nn.Module, type)):
        return None  # tensors are graph inputs, submodules are walked on their own
    if isinstance(value, _CONSTANT_TYPES):
        return ("constant", value)
    if isinstance(value, tuple) and all(isinstance(v, _CONSTANT_TYPES) for v in value):
        return ("constant", value)
    if isinstance(value, functools.partial):
        # dynamo guards a partial on its function and arguments, not on the partial object
        # (transformers' GELUTanh holds `partial(F.gelu, approximate="tanh")` per instance)
        parts = [_value_key(v) for v in (value.func, *value.args, *value.keywords.values())]
        if any(part is None for part in parts):
            return None
        return ("object", (tuple(parts), tuple(value.keywords)))
    if inspect.ismethod(value) and value.__self__ is owner:
        return ("object", id(value.__func__))  # self.act = self._impl: the same code per block
    if callable(value):
        return ("object", id(value))  # calling it guards on its identity (pytorch#163329)
    return None  # other objects (configs) are guarded on the attributes read, by value


def _instance_state(block: nn.Module) -> dict[str, tuple[type, str, tuple[str, Hashable]]]:
    state = {}
    for rel, sub in block.named_modules():
        for attr, value in vars(sub).items():
            if attr.startswith("_") or attr == "training":
                continue
            key = _value_key(value, owner=sub)
            if key is not None:
                state[f"{rel}.{attr}" if rel else attr] = (type(sub), attr, key)
    return state


def _structure(block: nn.Module) -> tuple[tuple[str, type], ...]:
    return tuple((name, type(sub)) for name, sub in block.named_modules())


def plan_regional(
    model: nn.Module, blocks: BlocksArg, compile_kwargs: dict[str, Any], *, keep_kv_cache: bool
) -> RegionalPlan:
    """The whole plan of a regional compile, made before anything compiles: the block groups
    (discovered, or chosen by ``blocks``), each with its compile options (the call's, then the
    group's own), its class, its label, what the guard preflight predicts for it (warned where
    its blocks would recompile) and its recompile limit (:func:`plan_recompile_limits`).

    Example:
        >>> plan = plan_regional(model, None, {}, keep_kv_cache=False)  # doctest: +SKIP
        >>> plan.groups[0].preflight.graphs  # doctest: +SKIP
        1
    """
    plan = group_blocks(model, blocks)
    plan.dynamic = compile_kwargs.get("dynamic")
    names = [group.class_name for group in plan.groups]
    for index, group in enumerate(plan.groups):
        instances = [model.get_submodule(name) for name in group.names]
        group.compile_kwargs = {**compile_kwargs, **group.compile_kwargs}
        group.block_class = type(instances[0])
        unique = names.count(group.class_name) == 1
        group.label = group.class_name if unique else f"{group.class_name}{index}"
        group.preflight = preflight_group(
            group.class_name,
            instances,
            cache_disabled=not keep_kv_cache,
            requires_grad=requires_grad_variants(model, instances),
        )
    plan_recompile_limits(plan)
    return plan


def find_instance_variants(
    instances: Sequence[nn.Module],
    *,
    cache_disabled: bool = True,
    keys: Sequence[Hashable] | None = None,
) -> tuple[list[GuardFinding], list[tuple[int, int]]]:
    """Attributes that differ between instances of one group and are read by their methods.

    Instances are first split by structure (T5's encoder and decoder blocks are different graphs by
    construction); within each, differing attributes the code uses itself are variants
    (``certain=True``), those only handed on are reported with ``certain=False``. ``keys`` (from
    :func:`requires_grad_variants`) adds what else dynamo guards per instance. Returns the findings
    and, per structure, ``(instances, certain variants)``.
    """
    extra = {id(block): key for block, key in zip(instances, keys)} if keys is not None else {}
    by_structure: dict[tuple, list[nn.Module]] = {}
    for block in instances:
        by_structure.setdefault(_structure(block), []).append(block)
    findings: dict[str, GuardFinding] = {}
    counts: list[tuple[int, int]] = []
    for blocks in by_structure.values():
        states = [_instance_state(block) for block in blocks]
        deciding: list[str] = []
        for path in sorted(set.intersection(*(set(state) for state in states))):
            entries = [state[path] for state in states]
            keys = [entry[2] for entry in entries]
            owner, attr, (kind, _) = entries[0]
            uses = attribute_uses(owner, attr) if len(set(keys)) > 1 else frozenset()
            if not uses:
                continue
            cache_only = attr in _CACHE_ONLY_ATTRS and owner.__module__.startswith("transformers.")
            if cache_disabled and cache_only:
                continue
            # with the cache kept, it indexes the cache's per-layer state: a graph per value,
            # however the code reads it (GPT-2 in its own code, Llama handing it to cache.update)
            certain = DECIDES in uses or cache_only
            if certain:
                deciding.append(path)
            shown = tuple(k[1] if k[0] == "constant" else "<object>" for k in keys)
            findings.setdefault(
                path, GuardFinding(path, kind, shown, cache_only=cache_only, certain=certain)
            )
        variants = {
            (tuple(state[path][2] for path in deciding), extra.get(id(block)))
            for block, state in zip(blocks, states)
        }
        counts.append((len(blocks), len(variants)))
    return list(findings.values()), counts


def _describe(finding: GuardFinding) -> str:
    if finding.kind == "object":
        return f"`{finding.attribute}` (a distinct object per block)"
    shown = ", ".join(map(repr, finding.values[:6])) + (", ..." if len(finding.values) > 6 else "")
    return f"`{finding.attribute}` (values {shown})"


def requires_grad_variants(
    model: nn.Module, instances: Sequence[nn.Module]
) -> tuple[list[Hashable], list[Hashable], list[str]]:
    """What dynamo guards about each block's tensors (parameters' and input's ``requires_grad``),
    in training and under ``no_grad``: ``(training keys, no_grad keys, names of blocks with a frozen
    parameter)``, for :func:`find_instance_variants`."""
    position = {id(p): i for i, p in enumerate(model.parameters())}
    first_trainable = min(
        (position[id(p)] for p in model.parameters() if p.requires_grad), default=None
    )
    names = {id(m): n for n, m in model.named_modules()}
    train: list[Hashable] = []
    evaluation: list[Hashable] = []
    frozen = []
    for block in instances:
        params = list(block.parameters())
        # dynamo guards each parameter's shape and requires_grad: blocks of one class in stages
        # of different widths are different graphs too
        pattern = tuple((tuple(p.shape), p.requires_grad) for p in params)
        starts = min((position[id(p)] for p in params), default=None)
        fed_by_trainable = (
            first_trainable is not None and starts is not None and first_trainable < starts
        )
        train.append((pattern, fed_by_trainable))
        evaluation.append(pattern)
        if not all(p.requires_grad for p in params):
            frozen.append(names.get(id(block), type(block).__name__))
    return train, evaluation, frozen


def preflight_group(
    class_name: str,
    instances: Sequence[nn.Module],
    *,
    cache_disabled: bool = True,
    requires_grad: tuple[list[Hashable], list[Hashable], list[str]] | None = None,
) -> Preflight:
    """Warn about per-instance guards in one block group and return its :class:`Preflight`.

    Only state the block's code uses itself is warned about (each value is a graph); state only
    handed on *may* recompile and is logged at INFO. The recompile limit is sized afterwards, for
    every group at once (:func:`plan_recompile_limits`).
    """
    findings, counts = find_instance_variants(instances, cache_disabled=cache_disabled)
    variants = sum(v for _, v in counts)
    train_keys, eval_keys, frozen = requires_grad or (None, None, [])
    graphs, eval_graphs = variants, variants
    if frozen or (train_keys and len(set(train_keys)) > 1):
        graphs, eval_graphs = (
            sum(
                v
                for _, v in find_instance_variants(
                    instances, cache_disabled=cache_disabled, keys=keys
                )[1]
            )
            for keys in (train_keys, eval_keys)
        )
    needed = graphs + eval_graphs  # training, and a no_grad evaluation
    maybe = [f for f in findings if not f.certain]
    result = Preflight(
        graphs=graphs, eval_graphs=eval_graphs, may_vary=tuple(f.attribute for f in maybe)
    )
    if maybe:
        logger.info(
            "%s: %s differ between blocks and are handed on to other functions; the "
            "blocks may compile one graph per value if those functions specialize on them "
            "(the measured count in RegionalPlan.report() says whether they did).",
            class_name,
            "; ".join(_describe(f) for f in maybe),
        )
    if graphs > variants or eval_graphs > variants:
        shown = ", ".join(frozen[:4]) + (", ..." if len(frozen) > 4 else "")
        logger.info(
            "%s: dynamo guards parameter shapes and requires_grad, so blocks of other "
            "widths, blocks with frozen parameters (%s) and blocks whose input needs no "
            "gradient (the first after frozen layers) are graphs of their own: %d in "
            "training, %d more under torch.no_grad() (per batch shape).",
            class_name,
            shown or "none",
            graphs,
            eval_graphs,
        )
    certain = [f for f in findings if f.certain]
    if certain:
        result = _warn_about_variants(class_name, instances, certain, counts, needed, result)
    return result


def _warn_about_variants(
    class_name: str,
    instances: Sequence[nn.Module],
    certain: list[GuardFinding],
    counts: list[tuple[int, int]],
    needed: int,
    result: Preflight,
) -> Preflight:
    """Warn (or log) that per-instance state the code uses makes the blocks several graphs."""
    variants = sum(v for _, v in counts)
    described = "; ".join(_describe(f) for f in certain)
    message = (
        f"{variants} of {len(instances)} {class_name} blocks differ in state their code "
        f"uses: {described}. Dynamo specializes on such attributes (ints/strings by value, "
        f"objects by identity), so the block compiles {variants} graphs instead of 1. Fix: "
        "pass the value as a forward argument or a tensor buffer, share one object across "
        "blocks, or select the variants as separate groups with blocks=."
    )
    if any(f.cache_only for f in certain):
        message += (
            " `layer_idx` is read only to index a KV cache: call the model with "
            "use_cache=False outside generation (compile_regional does so unless "
            "keep_kv_cache=True)."
        )
    if len(counts) > 1:
        message += f" ({len(counts)} block structures, each compiled on its own, are counted too.)"
    every_block_its_own = any(n >= 3 and v == n for n, v in counts)
    if every_block_its_own or needed > _dynamo.recompile_limit():
        warnings.warn(message, stacklevel=4)
        return Preflight(
            graphs=result.graphs,
            eval_graphs=result.eval_graphs,
            may_vary=result.may_vary,
            warning=message,
        )
    logger.info(message)
    return result


def plan_recompile_limits(plan: RegionalPlan) -> None:
    """Size the recompile limit of every group of ``plan`` for the graphs it may need
    (:attr:`BlockGroup.budget`) and the loss's (:attr:`RegionalPlan.loss_limit`); sets nothing in
    dynamo (``compile_regional`` marks each region with its limit as it compiles it).

    A group may need its training and ``no_grad`` graphs for each shape the run feeds
    (:func:`predicted_graphs`, with :attr:`RegionalPlan.expected`). Dynamo's limit is per code
    object, and transformers runs every block class through one wrapper
    (``forward_with_checkpointing``), so the groups that run one code object share one budget:
    their sum. Where it exceeds dynamo's limit, their calls compile under the raised limit, only
    while they run (:func:`~torchcompile_kit.diagnostics.set_recompile_limit`), never the
    process's. A limit the user gave (``recompile_limit=``) is kept (torch.compile holds it).
    """
    limit = _dynamo.recompile_limit()

    def graphs(train: int, evaluation: int) -> int:  # for the shapes expected
        return sum(predicted_graphs(train, evaluation, plan.expected, plan.dynamic))

    by_code: dict[Any, list[BlockGroup]] = {}
    for group in plan.groups:
        code = _forward_code(group.block_class) or id(group)  # torch.nn's own classes: alone
        by_code.setdefault(code, []).append(group)
    for code, sharing in by_code.items():
        needed = sum(graphs(g.preflight.graphs, g.preflight.eval_graphs) for g in sharing)
        set_by_user = [
            g.compile_kwargs["recompile_limit"]
            for g in sharing
            if "recompile_limit" in g.compile_kwargs
        ]
        budget = min(set_by_user) if set_by_user else max(limit, needed)
        names = [group.class_name for group in sharing]
        where = (
            f"{code.co_name} ({code.co_filename}:{code.co_firstlineno})"
            if hasattr(code, "co_name")
            else f"{sharing[0].class_name}.forward"
        )
        for group in sharing:
            others = tuple(n for n in names if n != group.class_name) if len(sharing) > 1 else ()
            group.budget = SharedBudget(
                code=where,
                shared_with=others,
                limit=budget,
                needed=needed,
                region_limit=None if set_by_user else budget,
            )
        if set_by_user and needed > budget:
            logger.info(
                "%s: may need %d graphs (training and no_grad evaluation, for the shapes "
                "expected), over the recompile_limit=%d given: the last may run eagerly",
                " and ".join(names),
                needed,
                budget,
            )
        elif len(sharing) > 1:
            logger.info(
                "%s share one code object (%s) and one recompile limit: %d for up to %d graphs",
                " and ".join(names),
                where.split(" (")[0],
                budget,
                needed,
            )
    plan.loss_limit = max(limit, graphs(1, 1))  # the loss: one variant


def size_recompile_limits(plan: RegionalPlan) -> None:
    """:func:`plan_recompile_limits` again, and the limits set on the regions compiled already:
    :func:`expect_shapes` (more shapes expected after the compile; the limit is read at every
    call, so it holds from the next one)."""
    plan_recompile_limits(plan)
    for group in plan.groups:
        if group.compiled is not None:
            set_recompile_limit(group.compiled.region, group.budget.region_limit)
    for extra in plan.extra_regions:  # the loss: one variant each
        set_recompile_limit(extra.region, plan.loss_limit)


def _forward_code(cls: type | None) -> Any:
    """The code object dynamo compiles for a block class (``None``: torch.nn's own classes,
    which ``compile_in_place`` gives an isolated frame per group)."""
    if cls is None or cls.__module__.startswith("torch.nn."):
        return None
    return getattr(getattr(cls, "forward", None), "__code__", None)
