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
from typing import Any

import torch
from torch import nn

from .. import _dynamo
from .._checks import check_module
from .discovery import BlocksArg, find_repeated_blocks
from .plan import PLAN_ATTR, get_regional_plan, register_undo, run_undo
from .preflight import preflight_group
from .transformers_support import disable_cache_in_plain_forwards, set_explicit_loss_functions

__all__ = ["compile_regional", "uncompile"]

logger = logging.getLogger(__name__)


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
    if get_regional_plan(model) is not None or _dynamo.compiled_module_names(model):
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
        compile_in_place(instances, **group.compile_kwargs)
    if remainder:
        for name in plan.eager:
            module = model.get_submodule(name)
            if any(True for _ in module.parameters()):
                compile_in_place([module], **compile_kwargs)
                plan.remainder.append(name)
        for undo in set_explicit_loss_functions(model, compile=True, **compile_kwargs):
            register_undo(model, undo)
    if not keep_kv_cache:
        for undo in disable_cache_in_plain_forwards(model):
            register_undo(model, undo)
    setattr(model, PLAN_ATTR, plan)
    logger.info("compile_regional: %s", plan.summary())
    return model


def uncompile(model: nn.Module) -> nn.Module:
    """Restore eager execution of a model compiled in place, and return it.

    Undoes :func:`compile_regional` (blocks, remainder, loss function, the ``use_cache`` hook),
    what other helpers registered with :func:`~torchcompile_kit.regional.register_undo`
    (``compile_peft``'s runtime checks) and any ``module.compile()`` call inside ``model``.
    Weights are untouched.

    Args:
        model: the model.

    Returns:
        ``model`` itself, running eagerly.

    Example:
        >>> model = uncompile(compile_regional(model))  # doctest: +SKIP
    """
    _check_model(model)
    for name in _dynamo.compiled_module_names(model):
        _dynamo.clear_compiled_call(model.get_submodule(name))
    model.__dict__.pop(PLAN_ATTR, None)
    run_undo(model)
    return model


def compile_in_place(modules: list[nn.Module], **compile_kwargs: Any) -> None:
    """``module.compile(**compile_kwargs)`` for each module, also for torch.nn's own classes.

    Dynamo does not trace a top-level frame inside ``torch.nn`` (it skips torch's own files), so
    ``nn.Linear().compile()`` or ``nn.TransformerEncoderLayer().compile()`` compiles nothing. Such
    modules get a frame of ours that calls into them: one ``torch.compile`` of it per call of this
    function, with its own cache (``isolate_recompiles``), so the modules passed together share one
    graph, as ``module.compile()`` shares one per class.

    Args:
        modules: modules of one class (a block group), or a single module.
        **compile_kwargs: passed to ``torch.compile``.
    """
    torch_nn = [m for m in modules if type(m).__module__.startswith("torch.nn.")]
    for module in modules:
        if not type(module).__module__.startswith("torch.nn."):
            module.compile(**compile_kwargs)
    if torch_nn:
        compiled = torch.compile(_call_module, **_dynamo.isolated_cache_kwarg(), **compile_kwargs)
        for module in torch_nn:
            _dynamo.set_compiled_call(module, functools.partial(compiled, module))


def _call_module(module: nn.Module, *args: Any, **kwargs: Any) -> Any:
    return _dynamo.eager_call(module, *args, **kwargs)


def _check_model(model: object) -> None:
    check_module("model", model)
    if _dynamo.is_torch_compile_wrapper(model):
        raise ValueError(
            "model is already wrapped by torch.compile(model) (an OptimizedModule); pass the "
            "original module (model._orig_mod) so blocks are compiled in place and "
            "state_dict keys stay clean."
        )
