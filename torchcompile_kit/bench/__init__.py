"""The benchmark command's machinery: ``torchcompile-kit bench`` runs the reference post's experiment.

Modules, one concept each:

- :mod:`.captioner`: the post's model (ViT + GPT-2 captioner) and caption data, ``tiny``/``full-size``;
- :mod:`.recipes`: the recipe table (the post's rows): each row's setup as data, written as the
  Python the bench runs and ``tune`` prints;
- :mod:`.config`: ``MeasureConfig``, how every row (and ``tune`` candidate) is measured;
- :mod:`.model_spec`: ``--model module:function``, the user's model;
- :mod:`.batches`: each recipe's batches (padding schemes, buckets);
- :mod:`.runner`: one recipe in its own fresh process (``run_recipe_isolated``);
- :mod:`.execute`: what that process runs; :mod:`.metrics`: what it measures;
  :mod:`.outcome`: ``Metrics`` and ``RecipeResult``, the typed row;
- :mod:`.paired`: each row's ratio to the baseline that stepped beside it, with its interval,
  and who else used the CPU meanwhile (what marks a row not to be quoted);
- :mod:`.results`, :mod:`.report`, :mod:`.charts`, :mod:`.progress`: output.

Only the command line and ``tune`` import this package; nothing below it does.
"""

from .batches import batch_stream, spec_buckets
from .captioner import PRESETS, build_captioner, caption_length_mix
from .config import MeasureConfig
from .model_spec import (
    ModelSpec,
    ModelSpecError,
    load_model_spec,
    loss_of,
    parse_model_spec,
    portable_model_spec,
)
from .outcome import Metrics
from .paired import paired_ratio
from .recipes import RECIPES, Recipe, RecipeContext, apply_recipe, setup_source
from .report import render_table
from .runner import RecipeResult, run_recipe_isolated

__all__ = [
    "PRESETS",
    "RECIPES",
    "MeasureConfig",
    "Metrics",
    "ModelSpec",
    "ModelSpecError",
    "Recipe",
    "RecipeContext",
    "RecipeResult",
    "apply_recipe",
    "setup_source",
    # also used by tune: the captioner and its batches for the correctness check, the loss
    "batch_stream",
    "build_captioner",
    "load_model_spec",
    "loss_of",
    "missing_requirement",
    # also used by tune: a run's ratio to eager from its paired blocks, with its interval
    "paired_ratio",
    "parse_model_spec",
    "portable_model_spec",
    "render_table",
    "run_recipe_isolated",
    "caption_length_mix",
    "spec_buckets",
]


def __getattr__(name: str):
    # lazily: `python -m torchcompile_kit.bench.execute` imports this package first, and an
    # eager import of .execute here would load that module twice (runpy's RuntimeWarning)
    if name == "missing_requirement":
        from .execute import missing_requirement

        return missing_requirement
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
