"""Regional compilation: compile the repeated blocks of a model once, not the whole model.

Since torch 2.5 dynamo inlines ``nn.Module``s, so parameters are graph inputs and one compiled
graph of a block class's ``forward`` serves every instance whose guards pass. Compiling the blocks
in place (``module.compile()``) rather than wrapping them (``torch.compile(module)``) keeps
``state_dict()`` keys free of ``_orig_mod.`` (torchtitan #2688, accelerate #4022).
"""

from __future__ import annotations

import functools
import logging
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from .block_discovery import BlocksArg, discover_blocks, eager_remainder, select_blocks
from .guard_preflight import preflight_group
from .integrations.transformers import disable_cache_in_plain_forwards, set_explicit_loss_functions

__all__ = ["BlockGroup", "RegionalPlan", "compile_regional", "find_repeated_blocks", "uncompile"]

logger = logging.getLogger(__name__)

_PLAN_ATTR = "_torchcompile_kit_plan"
_UNDO_ATTR = "_torchcompile_kit_undo"


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
    _undo: list[Callable[[], None]] = field(default_factory=list, repr=False)

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


def find_repeated_blocks(model: nn.Module, blocks: BlocksArg = None) -> RegionalPlan:
    """Plan regional compilation without compiling anything.

    Discovery (``blocks=None``) takes every class with two or more instances directly inside an
    ``nn.ModuleList``, ``nn.ModuleDict`` or ``nn.Sequential`` (leaf modules such as ``nn.Linear``
    are not blocks), plus the classes a transformers model names in ``_no_split_modules`` that
    occur at least twice. Only the outermost match is kept (a block inside a block is compiled
    as part of it). Several stacks (encoder and decoder) are all found.

    Args:
        model: the model to plan for.
        blocks: ``None`` for discovery, or a selector overriding it: a class (matches
            subclasses too), a class name (``"LlamaDecoderLayer"``), a module-path pattern
            (``"encoder.layer.*"``, fnmatch syntax), a list of these, or a mapping from selectors
            to per-group ``torch.compile`` keyword arguments.

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
    _check_model(model)
    if blocks is None:
        selected = [(name, "auto", {}) for name in discover_blocks(model)]
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


def compile_regional(
    model: nn.Module,
    *,
    blocks: BlocksArg = None,
    remainder: bool = False,
    keep_kv_cache: bool = False,
    **compile_kwargs: Any,
) -> nn.Module:
    """Compile each repeated block of ``model`` in place and return the same ``model``.

    Every block is compiled with ``module.compile(**compile_kwargs)``, so one graph per block
    class serves all its instances, ``state_dict()`` keys are unchanged and checkpoints load
    both ways. Before compiling, a guard preflight looks for per-instance state that would make
    blocks recompile (an int such as ``layer_idx`` read in ``forward``, a per-block object) and
    warns with the attribute and the fix; where blocks really come in more variants than the
    recompile limit allows, it raises the limit for that group only (``torch.compile``'s own
    ``recompile_limit=``), never globally.

    For transformers models, forwards that do not generate run with ``use_cache=False`` unless
    the caller passes ``use_cache``: the default cache makes every block guard on its own cache
    layer and recompile (8 recompiles, then eager). ``generate()`` is not affected.

    Args:
        model: the model; compiled in place.
        blocks: ``None`` to discover the repeated blocks, or a selector (see
            :func:`find_repeated_blocks`); a mapping gives per-group compile kwargs, which
            override ``compile_kwargs`` for that group.
        remainder: also compile each eager module that holds parameters (embeddings, final
            norm, LM head) as its own region, and a transformers model's loss function. Costs
            more compile time; see ``docs/benchmarks.md`` for when it pays.
        keep_kv_cache: leave transformers' ``use_cache`` default alone in plain forwards.
        **compile_kwargs: passed to ``torch.compile`` unchanged (``backend``, ``mode``,
            ``fullgraph``, ``dynamic``, ``options``, ...).

    Returns:
        ``model`` itself. The plan is available from :func:`get_regional_plan`.

    Raises:
        TypeError: ``model`` is not an ``nn.Module``.
        ValueError: ``model`` is a ``torch.compile`` wrapper (``OptimizedModule``).
        NoRepeatedBlocksError: no block class repeats and ``blocks`` was not given.
        BlockSelectorError: a ``blocks=`` selector matches nothing.

    Example:
        >>> model = compile_regional(GPT2LMHeadModel(config))  # doctest: +SKIP
        >>> model = compile_regional(vit_gpt2, blocks={"encoder.*": {"mode": "max-autotune"},
        ...                                            "decoder.*": {}})  # doctest: +SKIP
    """
    _check_model(model)
    if get_regional_plan(model) is not None or _compiled_modules(model):
        warnings.warn(
            f"{type(model).__name__} is already compiled (compile_regional or .compile() was "
            "called before); nothing was done. Call torchcompile_kit.uncompile(model) first to "
            "compile it again with other settings.",
            stacklevel=2,
        )
        return model
    plan = find_repeated_blocks(model, blocks)
    for group in plan.groups:
        group.compile_kwargs = {**compile_kwargs, **group.compile_kwargs}
        instances = [model.get_submodule(name) for name in group.names]
        limit = preflight_group(
            group.class_name,
            instances,
            compile_kwargs=group.compile_kwargs,
            cache_disabled=not keep_kv_cache,
        )
        if limit is not None:
            group.compile_kwargs["recompile_limit"] = limit
        for module in instances:
            module.compile(**group.compile_kwargs)
    if remainder:
        for name in plan.eager:
            module = model.get_submodule(name)
            if any(True for _ in module.parameters()):
                _compile_region(module, **compile_kwargs)
                plan.remainder.append(name)
        plan._undo.extend(set_explicit_loss_functions(model, compile=True, **compile_kwargs))
    if not keep_kv_cache:
        plan._undo.extend(disable_cache_in_plain_forwards(model))
    setattr(model, _PLAN_ATTR, plan)
    logger.info("compile_regional: %s", plan.summary())
    return model


def get_regional_plan(model: nn.Module) -> RegionalPlan | None:
    """The plan ``compile_regional`` recorded on ``model``, or ``None`` if it was not called.

    Example:
        >>> get_regional_plan(compile_regional(model)).summary()  # doctest: +SKIP
    """
    return getattr(model, _PLAN_ATTR, None)


def uncompile(model: nn.Module) -> nn.Module:
    """Restore eager execution of a model compiled in place, and return it.

    Undoes :func:`compile_regional` (blocks, remainder, loss function, the ``use_cache`` hook)
    and any ``module.compile()`` call inside ``model``. Weights are untouched.

    Args:
        model: the model.

    Returns:
        ``model`` itself, running eagerly.

    Example:
        >>> model = uncompile(compile_regional(model))  # doctest: +SKIP
    """
    _check_model(model)
    for module in _compiled_modules(model):
        module._compiled_call_impl = None  # what nn.Module.compile() set; there is no public undo
    plan = get_regional_plan(model)
    if plan is not None:
        for undo in reversed(plan._undo):
            undo()
        delattr(model, _PLAN_ATTR)
    for undo in reversed(model.__dict__.pop(_UNDO_ATTR, [])):
        undo()
    return model


def add_undo(model: nn.Module, undo: Callable[[], None]) -> None:
    """Register ``undo`` to run when :func:`uncompile` is called on ``model`` (internal).

    For helpers that install something next to a compile (``compile_peft``'s runtime checks).
    """
    model.__dict__.setdefault(_UNDO_ATTR, []).append(undo)


def _call_module(module: nn.Module, *args: Any, **kwargs: Any) -> Any:
    return module._call_impl(*args, **kwargs)


def _compile_region(module: nn.Module, **compile_kwargs: Any) -> None:
    """``module.compile()``, also for torch.nn's own modules.

    Dynamo does not trace a top-level frame inside torch.nn, so ``nn.Linear().compile()``
    compiles nothing; such a module gets a frame of ours that calls into it, with its own
    cache entries (``isolate_recompiles``) since that frame is shared by every such region.
    """
    if not type(module).__module__.startswith("torch.nn."):
        module.compile(**compile_kwargs)
        return
    module._compiled_call_impl = torch.compile(
        functools.partial(_call_module, module), isolate_recompiles=True, **compile_kwargs
    )


# --- checks


def _check_model(model: object) -> None:
    if not isinstance(model, nn.Module):
        raise TypeError(
            f"model must be a torch.nn.Module, got {type(model).__name__} ({model!r:.80}); "
            "pass the model object itself."
        )
    if isinstance(model, torch._dynamo.eval_frame.OptimizedModule):
        raise ValueError(
            "model is already wrapped by torch.compile(model) (an OptimizedModule); pass the "
            "original module (model._orig_mod) so blocks are compiled in place and "
            "state_dict keys stay clean."
        )


def _compiled_modules(model: nn.Module) -> list[nn.Module]:
    return [m for m in model.modules() if getattr(m, "_compiled_call_impl", None) is not None]
