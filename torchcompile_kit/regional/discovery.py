"""Which modules are blocks: discovery of repeated blocks, the ``blocks=`` selectors, the plan."""

from __future__ import annotations

import fnmatch
from collections import defaultdict
from collections.abc import Iterable, Mapping
from typing import Any

from torch import nn

from .._checks import check_module
from ..errors import BlockSelectorError, NoRepeatedBlocksError
from .plan import BlockGroup, RegionalPlan

__all__ = [
    "DECLARATION",
    "BlocksArg",
    "declared_blocks",
    "eager_remainder",
    "find_repeated_blocks",
    "group_blocks",
    "select_blocks",
]

DECLARATION = "_repeated_blocks"
"""The attribute a model declares its repeated blocks in: class names, as diffusers'
``ModelMixin._repeated_blocks`` does; set it on any module to declare yours."""
NO_SPLIT = "_no_split_modules"
"""transformers' (and diffusers') list of the classes not to split across devices: a hint."""

_CONTAINERS = (nn.ModuleList, nn.ModuleDict, nn.Sequential)

Selector = type | str
BlocksArg = Selector | Iterable[Selector] | Mapping[Selector, Mapping[str, Any]] | None


def _is_block_candidate(module: nn.Module) -> bool:
    # A block is a composite: leaf modules (Linear, Dropout) repeated in a Sequential are not.
    return not isinstance(module, _CONTAINERS) and next(module.children(), None) is not None


def declared_blocks(model: nn.Module) -> list[str]:
    """The modules of the classes ``model`` (or a module in it) declares in ``_repeated_blocks``,
    every instance counted (one graph per class); classes match along the ancestry (FSDP2's renamed
    classes). Empty when nothing declared is present."""
    declared = {
        name for module in model.modules() for name in (getattr(module, DECLARATION, None) or ())
    }
    if not declared:
        return []
    return _outermost(
        name
        for name, module in model.named_modules()
        if any(cls.__name__ in declared for cls in type(module).__mro__)
    )


def _discover(model: nn.Module) -> tuple[list[str], dict[type, str]]:
    """The discovered blocks, and why a class was taken where it is not the obvious one."""
    notes: dict[type, str] = {}
    in_containers: dict[type, int] = defaultdict(int)
    for module in model.modules():
        if isinstance(module, _CONTAINERS):
            for child in module.children():
                if _is_block_candidate(child):
                    in_containers[type(child)] += 1
    classes = {cls for cls, count in in_containers.items() if count >= 2}
    # the classes a model says not to split across devices (transformers', diffusers'
    # `_no_split_modules`): its blocks, where no container holds them
    hints = {name for module in model.modules() for name in (getattr(module, NO_SPLIT, None) or ())}
    if hints:
        counts: dict[type, int] = defaultdict(int)
        for module in model.modules():
            counts[type(module)] += 1
        # along the ancestry, as selectors match: FSDP2's fully_shard renames GPT2Block to
        # FSDPGPT2Block (a subclass), which an exact name test would miss
        classes |= {
            c for c, n in counts.items() if n >= 2 and any(k.__name__ in hints for k in c.__mro__)
        }
    # after the hints: _no_split_modules names stages too (SwinStage, of different widths)
    classes = _without_stages(model, classes, notes=notes)
    names = _outermost(name for name, m in model.named_modules() if type(m) in classes)
    if not names:
        raise NoRepeatedBlocksError(_no_blocks_message(model))
    return names, notes


def _no_blocks_message(model: nn.Module) -> str:
    """Why discovery found nothing: no class repeats in a container, or the repeated children are
    plain containers themselves (an ``nn.Sequential`` per layer), which a class cannot select."""
    nested = [
        name
        for name, module in model.named_modules()
        if isinstance(module, _CONTAINERS)
        and sum(isinstance(child, _CONTAINERS) for child in module.children()) >= 2
    ]
    if nested:
        path = nested[0] or "<model>"
        selector = f"{nested[0]}.*" if nested[0] else "*"
        return (
            f"found no repeated blocks in {type(model).__name__}: the repeated children of "
            f"{path!r} are plain containers (nn.Sequential/ModuleList/ModuleDict), and a "
            "container class is not taken as a block (every Sequential would match). Select "
            f"them by path: compile_regional(model, blocks={selector!r})."
        )
    return (
        f"found no repeated blocks in {type(model).__name__}: no module class occurs twice or "
        "more inside an nn.ModuleList/ModuleDict/Sequential. Name the blocks to compile, e.g. "
        "compile_regional(model, blocks=MyLayer), blocks='MyLayer' or blocks='layers.*'; or "
        "use model.compile() for the whole model."
    )


def _shapes(module: nn.Module) -> dict[str, tuple[int, ...]]:
    return {name: tuple(p.shape) for name, p in module.named_parameters()}


def _is_stage(instances: list[nn.Module]) -> bool:
    """Instances no two of which agree on the shapes of the parameters they both have (a UNet's
    down/up stages, Swin's stages, of different widths): compiled as blocks, each would be a graph
    of its own, reused by nothing. Extra parameters alone do not count (T5's first block alone
    holds the position bias, and shares every other shape with the rest)."""
    shapes = [_shapes(module) for module in instances]
    if len(shapes) < 2 or not any(shapes):
        return False
    return not any(
        all(a[name] == b[name] for name in a.keys() & b.keys())
        for i, a in enumerate(shapes)
        for b in shapes[i + 1 :]
    )


def _without_stages(model: nn.Module, classes: set[type], *, notes: dict[type, str]) -> set[type]:
    """Replace each stage class by the repeated classes inside it that do reuse a graph (two
    instances of one shape), the outermost of them. ``notes`` gets, per chosen inner class, the
    stages it was found in (in model order)."""
    instances: dict[type, list[nn.Module]] = defaultdict(list)
    for module in model.modules():
        instances[type(module)].append(module)
    found_in: dict[type, list[str]] = defaultdict(list)
    chosen: set[type] = set()
    for cls in [c for c in instances if c in classes]:  # model order: stable notes
        if not _is_stage(instances[cls]):
            chosen.add(cls)
            continue
        inner = {
            type(m)
            for stage in instances[cls]
            for m in stage.modules()
            if m is not stage and _is_block_candidate(m)
        }
        reused = {c for c in inner if len(instances[c]) >= 2 and not _is_stage(instances[c])}
        if not reused:
            chosen.add(cls)
            continue
        for inner_cls in reused:
            found_in[inner_cls].append(
                f"{cls.__name__} ({len(instances[cls])} of different widths)"
            )
        chosen |= reused
    for inner_cls, stages in found_in.items():
        notes[inner_cls] = f"inside the stages {', '.join(stages)}, each its own graph"
    return chosen


def _outermost(names: Iterable[str]) -> list[str]:
    kept: list[str] = []
    for name in names:  # named_modules order: a parent comes before its children
        if not any(name == k or name.startswith(k + ".") for k in kept):
            kept.append(name)
    return kept


def _as_selector_list(blocks: BlocksArg) -> list[tuple[Selector, dict[str, Any]]]:
    if isinstance(blocks, Mapping):
        out = []
        for selector, kwargs in blocks.items():
            if not isinstance(kwargs, Mapping):
                raise BlockSelectorError(
                    f"blocks={{{selector!r}: {kwargs!r}}}: the value for "
                    "each selector must be a dict of torch.compile keyword "
                    f"arguments, e.g. {{'mode': 'max-autotune'}} or {{}}."
                )
            out.append((selector, dict(kwargs)))
        return out
    if isinstance(blocks, (str, type)):
        return [(blocks, {})]
    if isinstance(blocks, Iterable):
        return [(selector, {}) for selector in blocks]
    raise BlockSelectorError(
        f"blocks={blocks!r} is not a selector; pass a module class, a class "
        "name, a module-path pattern such as 'encoder.layer.*', a list of "
        f"these, or a dict {{selector: compile_kwargs}}."
    )


def _matches(selector: Selector, name: str, module: nn.Module, class_names: set[str]) -> bool:
    if isinstance(selector, type):
        return isinstance(module, selector)
    if selector in class_names:
        # by name, subclasses too: FSDP2's fully_shard renames a class to FSDP<name>
        return any(cls.__name__ == selector for cls in type(module).__mro__)
    return bool(name) and fnmatch.fnmatchcase(name, selector)


def select_blocks(model: nn.Module, blocks: BlocksArg) -> list[tuple[str, str, dict[str, Any]]]:
    selectors = _as_selector_list(blocks)
    named = list(model.named_modules())
    class_names = {cls.__name__ for _, m in named for cls in type(m).__mro__}
    chosen: dict[str, tuple[str, dict[str, Any]]] = {}
    for selector, kwargs in selectors:
        if not isinstance(selector, (str, type)):
            raise BlockSelectorError(
                f"blocks selector {selector!r} must be a module class, a "
                "class name or a module-path pattern (str)."
            )
        label = selector.__name__ if isinstance(selector, type) else selector
        hits = _outermost(n for n, m in named if _matches(selector, n, m, class_names))
        if not hits:
            examples = sorted({type(m).__name__ for _, m in named})[:8]
            raise BlockSelectorError(
                f"blocks selector {label!r} matches no module of {type(model).__name__}. "
                f"Class names here include {examples}; module paths look like "
                f"{[n for n, _ in named[1:4]]} (patterns use fnmatch, e.g. 'encoder.layer.*')."
            )
        for name in hits:
            for other, (other_label, _) in chosen.items():
                if name == other or name.startswith(other + ".") or other.startswith(name + "."):
                    raise BlockSelectorError(
                        f"blocks selectors {other_label!r} and {label!r} "
                        f"overlap at {name!r}; each module may be selected "
                        "once (nested regions are not supported)."
                    )
            chosen[name] = (label, kwargs)
    order = {name: i for i, (name, _) in enumerate(named)}
    return [(n, lab, kw) for n, (lab, kw) in sorted(chosen.items(), key=lambda x: order[x[0]])]


def eager_remainder(model: nn.Module, groups: list[BlockGroup]) -> list[str]:
    blocks = {name for g in groups for name in g.names}
    holds_block = {name.rsplit(".", i)[0] for name in blocks for i in range(name.count(".") + 1)}
    eager: list[str] = []

    def visit(prefix: str, module: nn.Module) -> None:
        for child_name, child in module.named_children():
            name = f"{prefix}.{child_name}" if prefix else child_name
            if name in blocks:
                continue
            if name in holds_block:
                visit(name, child)
            else:
                eager.append(name)

    if "" not in blocks:
        visit("", model)
    return eager


def find_repeated_blocks(model: nn.Module, blocks: BlocksArg = None) -> RegionalPlan:
    """Plan regional compilation without compiling anything.

    With ``blocks=None``: the classes a model declares in ``_repeated_blocks`` (diffusers' models;
    :func:`declared_blocks`), else every class with two or more instances directly inside a
    ``ModuleList``/``ModuleDict``/``Sequential``, plus transformers' ``_no_split_modules`` classes
    that repeat; only the outermost match is kept, and several stacks are all found. Each group's
    ``selector`` says where it came from.

    Args:
        model: the model to plan for.
        blocks: ``None`` for discovery, or a selector: a class (subclasses match), a class name, a
            module-path pattern (``"encoder.layer.*"``), a list of these, or a mapping from
            selectors to per-group ``torch.compile`` kwargs.

    Returns:
        The :class:`RegionalPlan`: ``.blocks`` (qualified names), ``.groups`` by class, ``.eager``.

    Raises:
        TypeError: ``model`` is not an ``nn.Module``.
        NoRepeatedBlocksError: ``blocks=None`` and no class repeats.
        BlockSelectorError: a selector is malformed or matches no module.

    Example:
        >>> plan = find_repeated_blocks(model)  # doctest: +SKIP
        >>> plan.blocks[:2]  # doctest: +SKIP
        ['transformer.h.0', 'transformer.h.1']
    """
    check_module("model", model)
    return group_blocks(model, blocks)


def group_blocks(model: nn.Module, blocks: BlocksArg) -> RegionalPlan:
    """:func:`find_repeated_blocks` on a model checked already (``compile_regional``)."""
    declared = declared_blocks(model) if blocks is None else []
    if declared:
        selected = [(name, f"declared: {DECLARATION}", {}) for name in declared]
    elif blocks is None:
        names, notes = _discover(model)
        selected = [
            (
                name,
                " ".join(["discovered", notes.get(type(model.get_submodule(name)), "")]).strip(),
                {},
            )
            for name in names
        ]
    else:
        selected = select_blocks(model, blocks)
    groups: dict[tuple[str, str], BlockGroup] = {}
    for name, selector, kwargs in selected:
        cls_name = type(model.get_submodule(name)).__name__
        key = (selector, cls_name)
        if key not in groups:
            groups[key] = BlockGroup(
                class_name=cls_name, names=[], selector=selector, compile_kwargs=dict(kwargs)
            )
        groups[key].names.append(name)
    plan_groups = list(groups.values())
    return RegionalPlan(groups=plan_groups, eager=eager_remainder(model, plan_groups))
