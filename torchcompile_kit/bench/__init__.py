"""The benchmark command: ``torchcompile-kit bench [RECIPE ...] [--size small|full]``.

Each recipe lives in its own module with a ``run(*, size: str) -> BenchResult`` function; the
command runs the chosen recipes (all of them by default), prints one table per recipe and writes
one JSON file that records the versions, the machine, the date and the git commit.
"""

from __future__ import annotations

# recipe name -> (module, one-line description). Modules are imported only when run.
RECIPES: dict[str, tuple[str, str]] = {
    "regional": (
        "torchcompile_kit.bench.regional",
        "cold compile and steady step: eager vs full torch.compile vs compile_regional",
    ),
    "shapes": (
        "torchcompile_kit.bench.shapes",
        "padding, distinct shapes and recompiles: pad-to-max / multiple-of-32 / buckets",
    ),
    "optimizer": (
        "torchcompile_kit.bench.optimizer",
        "optimizer step time: for-loop, foreach, fused, compile_optimizer (step, foreach_map)",
    ),
}
