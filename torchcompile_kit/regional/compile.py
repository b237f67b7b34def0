"""Regional compilation: compile the repeated blocks of a model once, in place (``module.compile()``
keeps ``state_dict()`` keys free of ``_orig_mod.``), and undo it.
"""

from __future__ import annotations

import functools
import logging
import warnings
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from .. import _dynamo
from .._checks import check_compile_kwargs, check_module
from .._moved import refuses_moved
from .._undo import has_undo, register_undo, run_undo
from ..diagnostics import FirstCallVerifier, explaining, mark_region
from .cuda_graphs import check_cuda_graphs_at_first_call
from .discovery import BlocksArg
from .plan import PENDING_ATTR, PLAN_ATTR, CompiledGroup, get_regional_plan
from .precompiled import PrecompiledRegion, precompile_refusal, region_fingerprint
from .preflight import plan_regional
from .transformers_support import prepare_transformers, set_explicit_loss_functions

__all__ = [
    "already_compiled",
    "check_model",
    "compile_model",
    "compile_regional",
    "install_first_call_check",
    "uncompile",
]

logger = logging.getLogger(__name__)


@refuses_moved
def compile_regional(
    model: nn.Module,
    *,
    blocks: BlocksArg = None,
    compile_loss: bool = True,
    keep_kv_cache: bool = False,
    precompile: bool = False,
    verify: bool = False,
    **compile_kwargs: Any,
) -> nn.Module:
    """Compile each repeated block of ``model`` in place and return the same ``model``.

    Every block is compiled with ``module.compile(**compile_kwargs)``, so one graph per block class
    serves all its instances and ``state_dict()`` keys are unchanged. A guard preflight first warns
    about per-instance state that would make blocks recompile (``layer_idx`` read in ``forward``),
    and raises the recompile limit for one group only where blocks really come in more variants.
    Training forwards of transformers models run with ``use_cache=False`` unless the caller passes
    ``use_cache``; calls that build or pass a KV cache run the blocks eagerly (warned once).
    docs/regional.md has the measurements behind each option. To compile other modules too (the
    embeddings, the LM head), name them in a ``blocks=`` list beside the blocks.

    Args:
        model: the model; compiled in place.
        blocks: ``None`` to discover the repeated blocks, or a selector (see
            :func:`find_repeated_blocks`); a mapping gives per-group compile kwargs.
        compile_loss: pin a transformers model's loss function (:func:`fix_loss_function`) and
            compile it; pays with a large vocabulary. No effect on other models.
        keep_kv_cache: leave transformers' ``use_cache`` default alone and compile the calls that
            pass a cache (a graph per layer).
        precompile: experimental (it rests on dynamo's private precompile API, see
            docs/cache.md): also save dynamo's traced code of each group with the compile cache,
            so a restart that loads it runs the blocks without tracing (inductor only; a group
            whose blocks differ in per-instance state is compiled the usual way, with a warning).
            The plan's ``precompile_path`` says which path each group took.
        verify: compare the first call in each state (train/eval, grad on/off) with eager and raise
            ``CompiledMismatchError`` if they differ. Off by default.
        **compile_kwargs: passed to ``torch.compile`` unchanged (``backend``, ``mode``,
            ``fullgraph``, ``dynamic``, ``options``, ...).

    Returns:
        ``model`` itself. The plan is available from :func:`get_regional_plan`.

    Raises:
        TypeError: ``model`` is not an ``nn.Module``, or ``verify`` or ``precompile`` is not a bool.
        ValueError: ``model`` is a ``torch.compile`` wrapper (``OptimizedModule``).
        NoRepeatedBlocksError: no block class repeats and ``blocks`` was not given.
        UnsafeCompileModeError: a CUDA-graph option (``mode="reduce-overhead"`` or
            ``"max-autotune"``, ``backend="cudagraphs"``) on a model on CUDA, at this call or at
            the first call after a move to CUDA: one region's graph output is overwritten by the
            next region's replay (pytorch#152887); use :func:`compile_model` for CUDA graphs, or
            ``mode="max-autotune-no-cudagraphs"``.
        BlockSelectorError: a ``blocks=`` selector matches nothing.

    Example:
        >>> model = compile_regional(GPT2LMHeadModel(config))  # doctest: +SKIP
        >>> model = compile_regional(model, blocks=["transformer.h.*", "lm_head"])  # doctest: +SKIP
        >>> model = compile_regional(
        ...     vit_gpt2, blocks={"encoder.*": {"dynamic": False}, "decoder.*": {}}
        ... )  # doctest: +SKIP
    """
    check_model(model)
    flags = {"verify": verify, "precompile": precompile}
    check_compile_kwargs(compile_kwargs, caller="compile_regional", flags=flags)
    if already_compiled(model):
        return model
    # decide: the whole plan, before anything compiles
    plan = plan_regional(model, blocks, compile_kwargs, keep_kv_cache=keep_kv_cache)
    # refused here when the model is on CUDA already, else checked at its first call
    checking = check_cuda_graphs_at_first_call(
        model,
        [compile_kwargs, *(group.compile_kwargs for group in plan.groups)],
        caller="compile_regional",
        per_region=True,
    )
    # apply: each group compiled, then what a transformers model needs around the blocks
    for group in plan.groups:
        instances = [model.get_submodule(name) for name in group.names]
        precompiled = _compile_modules(
            instances, group.label, precompile, group.preflight, **group.compile_kwargs
        )
        # the measured report credits the group with what dynamo compiles inside these calls,
        # which run under the group's recompile limit (one code object, one limit: sized for all
        # the groups that run it)
        region = mark_region(
            instances, group.class_name, names=group.names, limit=group.budget.region_limit
        )
        group.compiled = CompiledGroup(region=region, precompile=precompiled)
    prepared = prepare_transformers(
        model,
        plan,
        compile_loss=compile_loss,
        keep_kv_cache=keep_kv_cache,
        precompile=precompile,
        compile_kwargs=compile_kwargs,
    )
    plan.extra_regions = prepared.loss_regions
    for undo in (checking, prepared.undo, _warn_when_traced_whole(model, plan)):
        if undo is not None:
            register_undo(model, undo)
    if verify:
        install_first_call_check(model, "compile_regional", compile_kwargs)
    setattr(model, PLAN_ATTR, plan)
    logger.info("compile_regional: %s", plan.summary())
    return model


@refuses_moved
def compile_model(
    model: nn.Module, *, precompile: bool = False, verify: bool = False, **compile_kwargs: Any
) -> nn.Module:
    """Compile the whole ``model`` in place (``model.compile()``) and return it.

    On a transformers model the loss function is pinned first (:func:`fix_loss_function`), so the
    step has no graph break at the loss. ``state_dict()`` keys are unchanged;
    :func:`uncompile` undoes it.

    Args:
        model: the model; compiled in place.
        precompile: experimental (dynamo's private precompile API): also save dynamo's traced
            code with the compile cache, so a restart that loads it runs the model without
            tracing (inductor only; docs/cache.md).
        verify: compare the first call in each state with eager (also the first call that runs a
            precompiled entry) and raise ``CompiledMismatchError`` on a difference. Off by
            default.
        **compile_kwargs: passed to ``torch.compile`` (``backend``, ``fullgraph``, ``dynamic``,
            ...).

    Returns:
        ``model`` itself.

    Raises:
        TypeError: ``model`` is not an ``nn.Module``, or ``verify`` or ``precompile`` is not a bool.
        ValueError: ``model`` is a ``torch.compile`` wrapper (``OptimizedModule``).

    Example:
        >>> model = compile_model(torch.nn.Linear(4, 2), backend="eager")
        >>> model(torch.ones(1, 4)).shape
        torch.Size([1, 2])
    """
    check_model(model)
    flags = {"verify": verify, "precompile": precompile}
    check_compile_kwargs(compile_kwargs, caller="compile_model", flags=flags)
    if already_compiled(model):
        return model
    for undo in set_explicit_loss_functions(model):
        register_undo(model, undo)
    _compile_modules(
        [model],
        type(model).__name__,
        precompile,
        None,
        plain=lambda modules, **kwargs: model.compile(**kwargs),
        **compile_kwargs,
    )
    check_cuda_graphs_at_first_call(
        model, [compile_kwargs], caller="compile_model", per_region=False
    )
    if verify:
        install_first_call_check(model, "compile_model", compile_kwargs)
    return model


def install_first_call_check(
    model: nn.Module,
    recipe: str,
    compile_kwargs: dict[str, Any],
    grads_checked: dict[Any, str] | None = None,
) -> None:
    """``verify=True``: the first call in each state compared with eager. A whole model compiled
    in place has its compiled call wrapped; a regionally compiled one gets hooks, installed last so
    its pre-hook sees the call as the other hooks left it. ``grads_checked``: the states whose
    gradients a background worker compared already (:class:`FirstCallVerifier`)."""
    verifier = FirstCallVerifier(
        model,
        recipe=recipe,
        backend=compile_kwargs.get("backend", "inductor"),
        grads_checked=grads_checked,
    )
    if not _dynamo.wrap_compiled_call(model, verifier.wrap):
        register_undo(model, verifier.install_hooks())


def _compile_modules(
    modules: list[nn.Module],
    label: str,
    precompile: bool,
    preflight: Any,
    plain: Callable[..., None] | None = None,
    **compile_kwargs: Any,
) -> PrecompiledRegion | str | None:
    """Compile ``modules`` in place, through one :class:`PrecompiledRegion` when ``precompile``
    and it can be, else with ``plain`` (:func:`compile_in_place`); returns the region, why it could
    not be (a sentence, also warned), or ``None``."""
    refusal = precompile_refusal(compile_kwargs, preflight) if precompile else None
    if not precompile or refusal is not None:
        (plain or compile_in_place)(modules, **compile_kwargs)
        if refusal is None:
            return None
        warnings.warn(
            f"precompile=True: {label} not precompiled: {refusal}; a restart traces it "
            "again (its kernels still load from the cache)",
            stacklevel=3,
        )
        return f"not precompiled: {refusal}"
    region = PrecompiledRegion(
        label, region_fingerprint(modules[0], compile_kwargs), compile_kwargs
    )
    for module in modules:
        _dynamo.set_compiled_call(module, functools.partial(region, module))
    return region


def already_compiled(model: nn.Module) -> bool:
    """Whether ``model`` is compiled in place already, or a background compile of it is under
    way (then say so: nothing is done)."""
    pending = PENDING_ATTR in model.__dict__
    if (
        get_regional_plan(model) is None
        and not _dynamo.compiled_module_names(model)
        and not pending
    ):
        return False
    warnings.warn(
        f"{type(model).__name__} is already compiled (compile_regional, compile_model, "
        "compile_in_background or .compile() was called before); nothing was done. Call "
        "torchcompile_kit.uncompile(model) first to compile it again with other settings.",
        stacklevel=3,
    )
    return True


def uncompile(model: Any) -> Any:
    """Restore eager execution of a model or optimizer compiled in place, and return it.

    For a model: undoes :func:`compile_regional` (blocks, loss, the ``use_cache`` hook),
    ``compile_peft`` and any ``module.compile()`` inside it; weights untouched. For an optimizer (or
    accelerate's wrapper): undoes ``compile_optimizer``, state kept. ``TypeError`` for anything
    else.

    Example:
        >>> model = uncompile(compile_regional(model))  # doctest: +SKIP
        >>> optimizer = uncompile(compile_optimizer(optimizer))  # doctest: +SKIP
    """
    if hasattr(model, "param_groups") and not isinstance(model, nn.Module):
        inner = getattr(model, "optimizer", None)  # accelerate's AcceleratedOptimizer
        run_undo(inner if inner is not None and not has_undo(model) else model)
        return model
    check_model(model)
    for name in _dynamo.compiled_module_names(model):
        _dynamo.clear_compiled_call(model.get_submodule(name))
    model.__dict__.pop(PLAN_ATTR, None)
    run_undo(model)
    return model


def compile_in_place(modules: list[nn.Module], **compile_kwargs: Any) -> None:
    """``module.compile(**compile_kwargs)`` for each module, also for torch.nn's own classes.

    Dynamo does not trace a top-level frame inside ``torch.nn``, so those modules get a frame of
    ours that calls into them: one ``torch.compile`` per call of this function, with its own cache
    (``isolate_recompiles``), so the modules passed together share one graph.
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


def _warn_when_traced_whole(model: nn.Module, plan: Any) -> Callable[[], None]:
    """A pre-hook on ``model`` that warns when a whole-model compile traces it.

    An outer ``torch.compile(model)`` (HF ``Trainer`` with ``torch_compile=True``, accelerate's
    ``dynamo_backend``, ``model.compile()``) inlines every block's ``forward`` and ignores their
    in-place compile. The regional compile runs ``model``'s own forward eagerly, so a trace of it
    can only be such an outer compile.
    """
    groups = ", ".join(group.class_name for group in plan.groups)
    noted: list[bool] = []

    @torch.compiler.assume_constant_result  # runs in Python once per trace: no graph break
    def note() -> bool:
        if not noted and not explaining():  # explain_graph_breaks traces it on purpose
            noted.append(True)
            warnings.warn(
                f"{type(model).__name__} was compiled regionally ({groups}), and now a "
                "whole-model torch.compile is tracing it (torch.compile(model), "
                "model.compile(), Trainer with TrainingArguments(torch_compile=True), "
                "accelerate's dynamo_backend): it inlines the blocks into one "
                "whole-model graph and their regional compile (a graph per block "
                "class, its options) is not what runs. Keep one of the two: "
                "TrainingArguments(torch_compile=False) with compile_regional, or "
                "torchcompile_kit.uncompile(model) before the whole-model compile.",
                stacklevel=2,
            )
        return True

    def hook(module: nn.Module, args: tuple) -> None:
        if torch.compiler.is_compiling():
            note()

    return model.register_forward_pre_hook(hook).remove


def check_model(model: object) -> None:
    check_module("model", model)
    if _dynamo.is_torch_compile_wrapper(model):
        raise ValueError(
            "model is already wrapped by torch.compile(model) (an OptimizedModule); "
            "pass the original module (model._orig_mod) so blocks are compiled in "
            "place and state_dict keys stay clean."
        )
