"""The recipe table: the seed's rows, each a way to compile the same model and feed it batches.

A :class:`Recipe` is data: its group, what it needs (CUDA, the compile cache, ...), how its
batches are padded, and one ``apply`` function that compiles the model and optimizer with the
library's *public* helpers only (so the bench doubles as the user's integration test). The
process that runs it (:mod:`.execute`) builds the model, calls ``apply`` and measures.

Groups follow the seed post: ``static`` (pad to max), ``dynamic`` (variable caption length),
``warm-up`` (cold vs warm compile, regional, the nested hybrid), ``distributed`` (DDP, 2 ranks).
``default=False`` rows are opt-in (name them, or ``--all``): they are heavy on a CPU.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, Literal

from .captioner import PRESETS

__all__ = [
    "RECIPES",
    "Recipe",
    "RecipeContext",
    "UnknownRecipeError",
    "check_preset",
    "check_recipe_names",
    "default_recipe_names",
]

DataScheme = Literal["max", "longest", "multiple_of_32", "buckets"]


class UnknownRecipeError(ValueError):
    """A recipe or preset name the bench does not know."""


@dataclass(kw_only=True, slots=True)
class RecipeContext:
    """What a recipe's ``apply`` works on (in the recipe's own process)."""

    model: Any
    """The model; ``apply`` compiles it in place (or replaces it, e.g. with a DDP wrapper)."""
    optimizer: Any
    """The run's optimizer over the model's parameters: the ``--model`` spec's, else
    ``torch.optim.Adam(lr=1e-4)``; ``apply`` may compile or replace it."""
    backend: str
    """The ``torch.compile`` backend for every compile."""
    overrides: dict[str, Any]
    """``torch.compile`` kwargs that override the recipe's (``compile_overrides``)."""
    device: Any
    """The training device."""

    def kwargs(self, **recipe_kwargs: Any) -> dict[str, Any]:
        """The compile kwargs: backend, then the recipe's, then the overrides.

        ``mode`` and ``options`` are inductor's: with another backend (the tests' cheap one)
        they are dropped, since ``torch.compile`` refuses a backend together with a mode.
        """
        kwargs = {"backend": self.backend, **recipe_kwargs, **self.overrides}
        if kwargs["backend"] != "inductor":
            kwargs.pop("mode", None)
            kwargs.pop("options", None)
        return kwargs


@dataclass(kw_only=True, slots=True, frozen=True)
class Recipe:
    """One row of the bench."""

    name: str
    """Selectable name (``"full"``)."""
    group: str
    """``static``, ``dynamic``, ``warm-up`` or ``distributed``."""
    description: str
    """One line for ``--list`` and the table."""
    apply: Callable[[RecipeContext], None]
    """Compiles ``ctx.model`` / ``ctx.optimizer`` (eager recipes do nothing)."""
    data: DataScheme = "max"
    """How the captioner's batches are padded."""
    default: bool = True
    """In the default set (the tiny default run fits in 15 minutes on a 2-core CPU)."""
    requires: tuple[str, ...] = ()
    """``cuda``, ``cache`` (compile_cache), ``nested`` (nested_compile_region), ``encoder_decoder``."""
    baseline: str = "eager"
    """The recipe ``speedup`` divides by."""
    loss_reference: str | None = "eager"
    """The recipe whose losses this one's are compared with (same batches), or ``None``."""
    cache_from: str | None = None
    """Warm start: load the compile cache the named recipe saved (it runs first)."""
    save_cache: bool = False
    """Save the compile cache after the run (for a ``cache_from`` recipe)."""
    mark_dynamic: bool = False
    """Mark the sequence dim of every batch dynamic (``mark_dynamic_batch``)."""
    zero_grads: bool = False
    """Zero gradients in place (``zero_grads``) instead of ``optimizer.zero_grad()``."""
    world_size: int = 1
    """Processes (DDP ranks) the runner starts."""
    heavy_on: tuple[str, ...] = field(default=())
    """Devices on which the recipe is opt-in although ``default`` (e.g. ``("cpu",)``)."""


# --- apply functions: the library's public helpers only -----------------------------------------


def _eager(ctx: RecipeContext) -> None:
    """Nothing compiled."""


def _fix_loss(model: Any, **compile_kwargs: Any) -> None:
    """``fix_loss_function`` where applicable: a model without a transformers model keeps its loss.

    (Added for ``tune``, which runs these recipes on users' plain ``nn.Module`` models too.)
    """
    from torchcompile_kit import fix_loss_function
    from torchcompile_kit.regional import has_transformers_model

    if has_transformers_model(model):
        fix_loss_function(model, **compile_kwargs)


def _full(**recipe_kwargs: Any) -> Callable[[RecipeContext], None]:
    def apply(ctx: RecipeContext) -> None:
        _fix_loss(ctx.model)  # the seed's fix for the loss graph break
        ctx.model.compile(**ctx.kwargs(fullgraph=True, **recipe_kwargs))

    return apply


def _full_and_optimizer(impl: str) -> Callable[[RecipeContext], None]:
    def apply(ctx: RecipeContext) -> None:
        from torchcompile_kit import compile_optimizer

        _full()(ctx)
        ctx.optimizer = compile_optimizer(ctx.optimizer, impl=impl, backend=ctx.backend)

    return apply


def _full_and_fused_adam(ctx: RecipeContext) -> None:
    """Full compile + the run's Adam/AdamW rebuilt with ``fused=True``, the fastest eager
    optimizer (for ``tune``): same class, param groups and hyperparameters."""
    import torch

    optimizer = ctx.optimizer
    if not isinstance(optimizer, (torch.optim.Adam, torch.optim.AdamW)):
        raise TypeError(
            f"recipe 'fused-adam' rebuilds the optimizer with fused=True, which needs Adam or "
            f"AdamW; the run's optimizer is {type(optimizer).__name__!r}: leave this recipe out"
        )
    _full()(ctx)
    groups = [{k: v for k, v in g.items() if k not in ("foreach", "fused")} for g in optimizer.param_groups]
    ctx.optimizer = type(optimizer)(groups, fused=True)


def _modular(ctx: RecipeContext) -> None:
    from torchcompile_kit import compile_regional

    # the seed: encoder and decoder compiled apart, the encoder (static) with max-autotune
    encoder_mode = "max-autotune" if ctx.device.type == "cuda" else "max-autotune-no-cudagraphs"
    encoder = {"mode": encoder_mode} if ctx.backend == "inductor" else {}
    _fix_loss(ctx.model, compile=True, **ctx.kwargs(fullgraph=True))
    compile_regional(
        ctx.model,
        blocks={"encoder": encoder, "decoder": {}},
        **ctx.kwargs(fullgraph=True),
    )


def _regional(ctx: RecipeContext) -> None:
    from torchcompile_kit import compile_regional

    # the seed's regional recipe, compile_regional's defaults: every block compiled, and the loss
    compile_regional(ctx.model, **ctx.kwargs(fullgraph=True))


def _regional_blocks(ctx: RecipeContext) -> None:
    from torchcompile_kit import compile_regional

    # the blocks only: the loss and the modules around them eager
    compile_regional(ctx.model, compile_loss=False, **ctx.kwargs(fullgraph=True))


def _regional_remainder(ctx: RecipeContext) -> None:
    from torchcompile_kit import compile_regional

    # the blocks, and each module outside them that holds parameters (embeddings, final norm, LM
    # head) as a region of its own; the loss function compiled as in 'regional'
    compile_regional(ctx.model, remainder=True, **ctx.kwargs(fullgraph=True))


def _nested(ctx: RecipeContext) -> None:
    from torchcompile_kit import compile_regional

    # pins the transformers loss itself (no graph break), then one whole-model compile
    compile_regional(ctx.model, nested=True, **ctx.kwargs(fullgraph=True))


def _ddp(ctx: RecipeContext) -> None:
    from torch.nn.parallel import DistributedDataParallel

    _fix_loss(ctx.model)
    ctx.model = DistributedDataParallel(ctx.model)
    # DDP's gradient hooks break the graph (DDPOptimizer splits it per bucket): no fullgraph
    ctx.model.compile(**ctx.kwargs())


def _recipes() -> list[Recipe]:
    dyn = {"group": "dynamic", "data": "longest", "baseline": "eager-longest"}
    return [
        # static shapes: every caption padded to the max length
        Recipe(name="eager", group="static", description="eager, pad to max (the baseline)", apply=_eager),
        Recipe(name="full", group="static", description="model.compile(fullgraph=True) after fix_loss_function; cold, saves its cache",
               apply=_full(), save_cache=True),
        Recipe(name="max-autotune", group="static", description="full compile, mode='max-autotune'",
               apply=_full(mode="max-autotune"), default=False),
        Recipe(name="reduce-overhead", group="static", description="full compile, mode='reduce-overhead' (CUDA graphs)",
               apply=_full(mode="reduce-overhead"), requires=("cuda",)),
        Recipe(name="compile-optimizer", group="static", description="full compile + compile_optimizer(Adam)",
               apply=_full_and_optimizer("step")),
        Recipe(name="fused-adam", group="static", description="full compile + eager Adam(fused=True), the fastest eager optimizer",
               apply=_full_and_fused_adam, default=False),
        Recipe(name="foreach-map", group="static", description="full compile + compile_optimizer(impl='foreach_map') + zero_grads",
               apply=_full_and_optimizer("foreach_map"), zero_grads=True, default=False),
        # dynamic shapes: pad to the longest caption of the batch (a multiple of 8)
        Recipe(name="eager-longest", description="eager, pad to longest (baseline of this group)", apply=_eager, **dyn),
        Recipe(name="automatic-dynamic", description="full compile, dynamic=None: recompiles once, then dynamic",
               apply=_full(), default=False, **dyn),
        Recipe(name="mark-dynamic", description="full compile + mark_dynamic_batch(batch, 1) on every batch",
               apply=_full(), mark_dynamic=True, **dyn),
        Recipe(name="dynamic-true", description="full compile, dynamic=True",
               apply=_full(dynamic=True), default=False, **dyn),
        Recipe(name="multiple-of-32", group="dynamic", description="full compile, dynamic=False, pad to a multiple of 32 (the seed's way)",
               apply=_full(dynamic=False), data="multiple_of_32", baseline="eager-longest", default=False),
        Recipe(name="buckets", group="dynamic", description="plan_buckets + BucketBatchSampler + PadToBucketCollator, dynamic=False, every shape warmed up",
               apply=_full(dynamic=False), data="buckets", baseline="eager-longest", loss_reference=None),
        Recipe(name="modular", description="encoder and decoder compiled apart: compile_regional(blocks={'encoder': {mode}, 'decoder': {}})",
               apply=_modular, requires=("encoder_decoder",), default=False, **dyn),
        # warm-up: cold compile ('full' above), warm from the saved cache, regional, nested
        Recipe(name="full-warm", group="warm-up", description="full compile, warm: loads the cache 'full' saved",
               apply=_full(), cache_from="full", requires=("cache",)),
        Recipe(name="regional", group="warm-up", description="compile_regional(model, fullgraph=True); cold, saves its cache",
               apply=_regional, save_cache=True),
        Recipe(name="regional-warm", group="warm-up", description="compile_regional, warm: loads the cache 'regional' saved",
               apply=_regional, cache_from="regional", requires=("cache",)),
        Recipe(name="regional-blocks", group="warm-up", description="compile_regional(model, compile_loss=False): the blocks only (loss and remainder eager)",
               apply=_regional_blocks, default=False),
        Recipe(name="regional-remainder", group="warm-up", description="compile_regional(model, remainder=True): the loss, and the embeddings, final norm and LM head compiled too",
               apply=_regional_remainder, default=False),
        Recipe(name="nested", group="warm-up", description="the hybrid: one full compile, blocks as nested_compile_region (compile_regional(nested=True))",
               apply=_nested, requires=("nested",)),
        # distributed
        Recipe(name="ddp", group="distributed", description="DDP, 2 processes (gloo on CPU), compiled after wrapping",
               apply=_ddp, world_size=2, default=False, loss_reference=None),
    ]


RECIPES: dict[str, Recipe] = {recipe.name: recipe for recipe in _recipes()}
"""Every recipe, by name, in table order."""


def default_recipe_names(*, device_type: str) -> list[str]:
    """The recipes ``bench`` runs when none is named, in table order.

    Args:
        device_type: ``"cpu"`` or ``"cuda"``; rows that need CUDA are left out elsewhere.

    Returns:
        Names from :data:`RECIPES`.

    Example:
        >>> "eager" in default_recipe_names(device_type="cpu")
        True
    """
    return [
        r.name
        for r in RECIPES.values()
        if r.default and device_type not in r.heavy_on and ("cuda" not in r.requires or device_type == "cuda")
    ]


def check_recipe_names(names: Iterable[str]) -> list[str]:
    """``names`` as a list, or :class:`UnknownRecipeError` naming the unknown ones and the choices.

    Example:
        >>> check_recipe_names(["eager", "full"])
        ['eager', 'full']
    """
    names = list(names)
    unknown = [n for n in names if n not in RECIPES]
    if unknown:
        raise UnknownRecipeError(
            f"unknown recipe(s) {unknown!r}; choose from {list(RECIPES)!r} "
            "(torchcompile-kit bench --list describes them)"
        )
    return names


def check_preset(preset: str) -> str:
    """``preset`` if it names a captioner preset, else :class:`UnknownRecipeError`.

    Example:
        >>> check_preset("tiny")
        'tiny'
    """
    if preset not in PRESETS:
        raise UnknownRecipeError(f"unknown preset {preset!r}; choose from {list(PRESETS)!r}")
    return preset


def with_dependencies(names: Iterable[str]) -> list[str]:
    """``names`` plus each warm recipe's cold recipe, cold ones first, in table order."""
    wanted = set(names)
    for name in list(wanted):
        source = RECIPES[name].cache_from
        if source:
            wanted.add(source)
    return [name for name in RECIPES if name in wanted]
