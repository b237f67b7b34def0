"""The benchmark command's machinery: ``torchcompile-kit bench`` runs the reference post's
experiment.

One concept per module (the captioner, the recipe table, ``MeasureConfig``, the ``--model`` spec,
batches, the isolated runner and what its process runs and measures, the typed rows, paired
ratios, results, report, charts, progress). Only the command line and ``tune`` import it.
"""

from .batches import SEQUENCE_KEYS, batch_stream, spec_buckets
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
from .outcome import BackgroundUse, CacheUse, Metrics, Speedup
from .paired import paired_ratio, ratio_interval, speedup_unquotable
from .recipes import RECIPES, Recipe, RecipeContext, apply_recipe, setup_source
from .report import render_table
from .runner import RecipeResult, RunRequest, run_recipe_isolated

__all__ = [
    "PRESETS",
    "RECIPES",
    "BackgroundUse",
    "CacheUse",
    "MeasureConfig",
    "Metrics",
    "Speedup",
    "ModelSpec",
    "ModelSpecError",
    "Recipe",
    "RecipeContext",
    "RecipeResult",
    "apply_recipe",
    "setup_source",
    # also used by tune: the captioner and its batches for the correctness check, the loss, the
    # keys whose dim 1 is the sequence (its snippet marks them dynamic)
    "SEQUENCE_KEYS",
    "batch_stream",
    "build_captioner",
    "load_model_spec",
    "loss_of",
    "missing_requirement",
    # also used by tune and the doctor: a ratio to eager from paired blocks, with its interval
    "paired_ratio",
    "ratio_interval",
    "speedup_unquotable",
    "parse_model_spec",
    "portable_model_spec",
    "render_table",
    "RunRequest",
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
