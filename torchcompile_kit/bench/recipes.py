"""The recipe table: the reference post's rows, each a way to compile the same model and feed it
batches.

A :class:`Recipe` is data; :func:`setup_source` writes it as Python with the library's public
helpers, which the bench runs (:func:`apply_recipe`) and ``tune`` prints. ``tune``'s candidates,
gate and snippet read these rows; nothing else describes a recipe. Groups follow the post
(docs/benchmarks.md "Recipes"); ``default=False`` rows are opt-in (name them, or ``--all``).
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any, Literal

from ..errors import TorchCompileKitError

__all__ = [
    "RECIPES",
    "Recipe",
    "RecipeContext",
    "UnknownRecipeError",
    "apply_recipe",
    "check_recipe_names",
    "default_recipe_names",
    "setup_source",
]

DataScheme = Literal["max", "longest", "multiple_of_32", "buckets"]


class UnknownRecipeError(TorchCompileKitError, ValueError):
    """A recipe name the bench does not know."""


@dataclass(kw_only=True, slots=True)
class RecipeContext:
    """What a recipe's setup works on (in the recipe's own process)."""

    model: Any
    """The model; the setup compiles it in place (or replaces it, e.g. with a DDP wrapper)."""
    optimizer: Any
    """The run's optimizer over the model's parameters: the ``--model`` spec's, else
    ``torch.optim.Adam(lr=1e-4)``; the setup may compile or replace it."""
    backend: str
    """The ``torch.compile`` backend for every compile."""
    overrides: dict[str, Any]
    """``torch.compile`` kwargs that override the recipe's (``compile_overrides``)."""
    device: Any
    """The training device."""


@dataclass(kw_only=True, slots=True, frozen=True)
class Recipe:
    """One row of the bench and one candidate of ``tune``: how the model is compiled and fed.

    The compile is data (``compile``, ``compile_kwargs``, ``optimizer``, ``world_size``);
    :func:`setup_source` writes it as the Python a user would write, and that source is both
    what the bench runs (:func:`apply_recipe`) and what ``tune`` prints as its snippet.
    """

    name: str
    """Selectable name (``"full"``)."""
    group: str
    """``static``, ``dynamic``, ``warm-up`` or ``distributed``."""
    description: str
    """One line for ``--list`` and the table."""
    compile: Literal["none", "model", "regional"] = "none"
    """``model.compile(...)`` (after ``fix_loss_function`` on a transformers model),
    ``compile_regional(model, ...)``, or nothing."""
    compile_kwargs: dict[str, Any] = field(default_factory=dict)
    """Keyword arguments of that call besides the backend (``mode``, ``options`` and ``precompile``
    are dropped with a backend other than inductor, which refuses them)."""
    optimizer: Literal["as-is", "compiled", "foreach_map", "fused"] = "as-is"
    """The run's optimizer as it is, under ``compile_optimizer`` (``impl="foreach_map"``), or
    rebuilt with ``fused=True`` (Adam/AdamW only)."""
    data: DataScheme = "max"
    """How the captioner's batches are padded."""
    default: bool = True
    """In the default set (the tiny default run fits in 15 minutes on a 2-core CPU)."""
    requires: tuple[str, ...] = ()
    """``cuda``, ``cache`` (compile_cache), ``encoder_decoder``."""
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
    zero_grads_in_place: bool = False
    """Zero gradients in place (``zero_grads_in_place``) instead of ``optimizer.zero_grad()``."""
    world_size: int = 1
    """Processes the runner starts; above 1 the model is wrapped in DDP before it compiles."""
    heavy_on: tuple[str, ...] = field(default=())
    """Devices on which the recipe is opt-in although ``default`` (e.g. ``("cpu",)``)."""


def setup_source(
    recipe: Recipe, *, backend: str = "inductor", overrides: dict[str, Any] | None = None
) -> list[str]:
    """The recipe's setup as lines of Python acting on ``model`` and ``optimizer`` (imports first;
    empty for an eager recipe). ``backend`` is written unless ``"inductor"``; ``overrides`` are
    written over the recipe's kwargs.

    Example:
        >>> print("\\n".join(setup_source(RECIPES["full"])))  # doctest: +NORMALIZE_WHITESPACE
        from torchcompile_kit import compile_model
        compile_model(model, fullgraph=True, precompile=True)
    """
    kwargs = {**recipe.compile_kwargs, **(overrides or {})}
    if backend != "inductor":
        kwargs = {
            k: v
            for k, v in kwargs.items()
            if k not in ("mode", "options", "precompile", "background")
        }
        if isinstance(kwargs.get("blocks"), dict):
            kwargs["blocks"] = {
                name: {k: v for k, v in kw.items() if k != "mode"}
                for name, kw in kwargs["blocks"].items()
            }
        kwargs["backend"] = backend
    background = kwargs.pop("background", None)
    args = ", ".join(f"{k}={v!r}" for k, v in kwargs.items())
    backend_kw = "" if backend == "inductor" else f", backend={backend!r}"
    imports: list[str] = []
    lines: list[str] = []
    if recipe.world_size > 1:  # DDP's gradient hooks break the graph: its recipe has no fullgraph
        lines += [
            "from torch.nn.parallel import DistributedDataParallel",
            "model = DistributedDataParallel(model)",
        ]
    compile_fn = {"model": "compile_model", "regional": "compile_regional"}.get(recipe.compile)
    if compile_fn is not None and background:
        imports += ["compile_in_background", compile_fn]
        options = ""
        if isinstance(background, dict):  # the CPUs the worker gets (MeasureConfig.pin)
            imports.append("BackgroundCompile")
            options = f", worker=BackgroundCompile(cpus={background['cpus']!r})"
        lines.append(f"compile_in_background(model, {compile_fn}{options}, {args})")
    elif compile_fn is not None:
        imports.append(compile_fn)
        lines.append(f"{compile_fn}(model, {args})")
    if recipe.optimizer in ("compiled", "foreach_map"):
        imports.append("compile_optimizer")
        impl = ", impl='foreach_map'" if recipe.optimizer == "foreach_map" else ""
        lines.append(
            f"optimizer = compile_optimizer(optimizer{impl}{backend_kw})  # its step compiled"
        )
    elif recipe.optimizer == "fused":
        lines += [
            "# your Adam/AdamW rebuilt with fused=True: same param groups and hyperparameters",
            "optimizer = type(optimizer)(",
            "    [{k: v for k, v in g.items() if k not in ('foreach', 'fused')}",
            "     for g in optimizer.param_groups],",
            "    fused=True,",
            ")",
        ]
    public = sorted(name for name in imports if name != "BackgroundCompile")
    head = [f"from torchcompile_kit import {', '.join(public)}"] if public else []
    if "BackgroundCompile" in imports:
        head.append("from torchcompile_kit.regional import BackgroundCompile")
    return head + lines


def apply_recipe(recipe: Recipe, ctx: RecipeContext) -> None:
    """Run :func:`setup_source` on ``ctx.model`` and ``ctx.optimizer`` (replacing them when it
    does).

    The bench runs the very lines ``tune`` prints for the user, so the snippet is what was
    measured. ``optimizer="fused"`` refuses an optimizer other than Adam/AdamW (``TypeError``).

    Example:
        >>> apply_recipe(RECIPES["regional"], ctx)  # doctest: +SKIP
    """
    import torch

    if recipe.optimizer == "fused" and not isinstance(
        ctx.optimizer, (torch.optim.Adam, torch.optim.AdamW)
    ):
        raise TypeError(
            f"recipe {recipe.name!r} rebuilds the optimizer with fused=True, which "
            "needs Adam or AdamW; the run's optimizer is "
            f"{type(ctx.optimizer).__name__!r}: leave this recipe out"
        )
    source = "\n".join(setup_source(recipe, backend=ctx.backend, overrides=ctx.overrides))
    namespace = {"torch": torch, "model": ctx.model, "optimizer": ctx.optimizer}
    exec(compile(source, f"<recipe {recipe.name}>", "exec"), namespace)  # noqa: S102 - our own lines
    ctx.model, ctx.optimizer = namespace["model"], namespace["optimizer"]


_WHOLE = {"fullgraph": True}


def _recipes() -> list[Recipe]:
    dyn = {"group": "dynamic", "data": "longest", "baseline": "eager-longest"}
    full = {"compile": "model", "compile_kwargs": _WHOLE}
    full_precompiled = {"compile": "model", "compile_kwargs": {**_WHOLE, "precompile": True}}
    regional = {"compile": "regional", "compile_kwargs": {**_WHOLE, "precompile": True}}
    return [
        # static shapes: every caption padded to the max length
        Recipe(name="eager", group="static", description="eager, pad to max (the baseline)"),
        Recipe(
            name="full",
            group="static",
            description="compile_model(fullgraph=True, precompile=True): the whole model in "
            "place, the loss pinned; cold, saves its cache",
            save_cache=True,
            **full_precompiled,
        ),
        Recipe(
            name="full-verify",
            group="static",
            description="compile_model(fullgraph=True, verify=True): the first call checked "
            "against eager (the comparator); its cost is a note",
            compile="model",
            compile_kwargs={**_WHOLE, "verify": True},
            default=False,
        ),
        Recipe(
            name="max-autotune",
            group="static",
            description="full compile, mode='max-autotune'",
            compile="model",
            compile_kwargs={**_WHOLE, "mode": "max-autotune"},
            default=False,
        ),
        Recipe(
            name="reduce-overhead",
            group="static",
            description="full compile, mode='reduce-overhead' (CUDA graphs)",
            compile="model",
            compile_kwargs={**_WHOLE, "mode": "reduce-overhead"},
            requires=("cuda",),
        ),
        Recipe(
            name="compile-optimizer",
            group="static",
            description="full compile + compile_optimizer(the run's optimizer, Adam by default)",
            optimizer="compiled",
            **full,
        ),
        Recipe(
            name="fused-adam",
            group="static",
            description="full compile + the run's Adam/AdamW with fused=True, the fastest eager "
            "optimizer",
            optimizer="fused",
            default=False,
            **full,
        ),
        Recipe(
            name="foreach-map",
            group="static",
            description="full compile + compile_optimizer(impl='foreach_map') + "
            "zero_grads_in_place",
            optimizer="foreach_map",
            zero_grads_in_place=True,
            default=False,
            **full,
        ),
        # dynamic shapes: pad to the longest caption of the batch (a multiple of 8)
        Recipe(
            name="eager-longest",
            description="eager, pad to longest (baseline of this group)",
            **dyn,
        ),
        Recipe(
            name="automatic-dynamic",
            description="full compile, dynamic=None: recompiles once, then dynamic",
            default=False,
            **full,
            **dyn,
        ),
        Recipe(
            name="mark-dynamic",
            description="full compile + mark_dynamic_batch(batch, 1) on every batch (one dynamic "
            "graph)",
            mark_dynamic=True,
            **full,
            **dyn,
        ),
        Recipe(
            name="dynamic-true",
            description="full compile, dynamic=True",
            compile="model",
            compile_kwargs={**_WHOLE, "dynamic": True},
            default=False,
            **dyn,
        ),
        Recipe(
            name="multiple-of-32",
            group="dynamic",
            description="full compile, dynamic=False, pad to a multiple of 32 (the reference "
            "post's way)",
            compile="model",
            compile_kwargs={**_WHOLE, "dynamic": False},
            data="multiple_of_32",
            baseline="eager-longest",
            default=False,
        ),
        Recipe(
            name="buckets",
            group="dynamic",
            description="plan_buckets + BucketBatchSampler + PadToBucketCollator, dynamic=False, "
            "every shape warmed up",
            compile="model",
            compile_kwargs={**_WHOLE, "dynamic": False},
            data="buckets",
            baseline="eager-longest",
            loss_reference=None,
        ),
        Recipe(
            name="modular",
            description="encoder and decoder compiled apart, the encoder with "
            "mode='max-autotune-no-cudagraphs' (CUDA graphs are refused per region)",
            compile="regional",
            compile_kwargs={
                "blocks": {"encoder": {"mode": "max-autotune-no-cudagraphs"}, "decoder": {}},
                **_WHOLE,
            },
            requires=("encoder_decoder",),
            default=False,
            **dyn,
        ),
        # warm-up: cold compile ('full' above), warm from the saved cache, regional, in the
        # background
        Recipe(
            name="full-warm",
            group="warm-up",
            description="full compile, restarted with the compile cache 'full' saved: the model "
            "not traced",
            cache_from="full",
            requires=("cache",),
            **full_precompiled,
        ),
        Recipe(
            name="regional",
            group="warm-up",
            description="compile_regional(precompile=True): each repeated block compiled once "
            "and reused, and the loss; saves its cache",
            save_cache=True,
            **regional,
        ),
        Recipe(
            name="regional-warm",
            group="warm-up",
            description="compile_regional(precompile=True), restarted with the cache 'regional' "
            "saved: blocks not traced",
            cache_from="regional",
            requires=("cache",),
            **regional,
        ),
        Recipe(
            name="regional-verify",
            group="warm-up",
            description="compile_regional(fullgraph=True, verify=True): the first call checked "
            "against eager (the comparator); its cost is a note",
            compile="regional",
            compile_kwargs={**_WHOLE, "verify": True},
            default=False,
        ),
        Recipe(
            name="regional-background",
            group="warm-up",
            description="compile_in_background(model): trains eagerly at once while a worker "
            "process compiles, then switches to the worker's precompiled blocks",
            compile="regional",
            compile_kwargs={**_WHOLE, "background": True},
            default=False,
        ),
        Recipe(
            name="regional-blocks",
            group="warm-up",
            description="compile_regional(model, compile_loss=False): the blocks only (the loss "
            "and the other modules eager)",
            compile="regional",
            compile_kwargs={"compile_loss": False, **_WHOLE},
            default=False,
        ),
        # distributed
        Recipe(
            name="ddp",
            group="distributed",
            description="DDP, 2 processes (gloo on CPU), compiled after wrapping",
            compile="model",
            world_size=2,
            default=False,
            loss_reference=None,
        ),
    ]


RECIPES: dict[str, Recipe] = {recipe.name: recipe for recipe in _recipes()}
"""Every recipe, by name, in table order."""


def default_recipe_names(*, device_type: str) -> list[str]:
    """The recipes ``bench`` runs when none is named, in table order (CUDA rows only on CUDA).

    Example:
        >>> "eager" in default_recipe_names(device_type="cpu")  # doctest: +NORMALIZE_WHITESPACE
        True
    """
    return [
        r.name
        for r in RECIPES.values()
        if r.default
        and device_type not in r.heavy_on
        and ("cuda" not in r.requires or device_type == "cuda")
    ]


def check_recipe_names(names: Iterable[str]) -> list[str]:
    """``names`` as a list, or :class:`UnknownRecipeError` naming the unknown ones and the choices.

    Example:
        >>> check_recipe_names(["eager", "full"])  # doctest: +NORMALIZE_WHITESPACE
        ['eager', 'full']
    """
    names = list(names)
    unknown = [n for n in names if n not in RECIPES]
    if unknown:
        guesses = {n: difflib.get_close_matches(str(n), list(RECIPES), n=1) for n in unknown}
        hint = "; ".join(f"{n!r}: did you mean {g[0]!r}?" for n, g in guesses.items() if g)
        raise UnknownRecipeError(
            f"unknown recipe(s) {unknown!r}{'; ' + hint if hint else ''}; choose "
            f"from {list(RECIPES)!r} (torchcompile-kit bench --list describes them)"
        )
    return names


def with_dependencies(names: Iterable[str]) -> list[str]:
    """``names`` plus each warm recipe's cold recipe, cold ones first, in table order."""
    wanted = set(names)
    for name in list(wanted):
        source = RECIPES[name].cache_from
        if source:
            wanted.add(source)
    return [name for name in RECIPES if name in wanted]
