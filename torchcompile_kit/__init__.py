"""torchcompile_kit: make ``torch.compile`` pay off in real training loops.

Importing the package is cheap: it imports neither torch nor transformers, peft or accelerate,
and changes no dynamo/inductor setting. Each public name is loaded from its topic folder
(``regional``, ``shapes``, ``optim``, ``diagnostics``, ``adapters``, ...) the first time it is
used (PEP 562); ``docs/architecture.md`` describes the layout.

Example:
    >>> import torchcompile_kit as tck
    >>> model = tck.compile_regional(model)  # doctest: +SKIP
"""

from __future__ import annotations

import importlib
from typing import Any

__version__ = "0.1.0"

# public name -> module that defines it (relative to this package)
_EXPORTS: dict[str, str] = {
    # errors
    "BatchShapeError": "errors",
    "BlockSelectorError": "errors",
    "NoRepeatedBlocksError": "errors",
    "SequenceTooLongError": "errors",
    "TorchCompileKitError": "errors",
    "UnexpectedRecompileError": "errors",
    "UnsafeAdapterConfigError": "errors",
    "UnsupportedOptimizerError": "errors",
    # regional compilation
    "RegionalPlan": "regional",
    "compile_regional": "regional",
    "find_repeated_blocks": "regional",
    "fix_loss_function": "regional",
    "get_regional_plan": "regional",
    "uncompile": "regional",
    # optimizer
    "compile_optimizer": "optim",
    "foreach_map_adam_step": "optim",
    "zero_grads": "optim",
    # shapes
    "BucketBatchSampler": "shapes",
    "PadToBucketCollator": "shapes",
    "mark_dynamic_batch": "shapes",
    "pad_to_bucket": "shapes",
    "plan_buckets": "shapes",
    "warmup_shapes": "shapes",
    # diagnostics
    "EquivalenceReport": "diagnostics",
    "check_compile_equivalence": "diagnostics",
    "no_recompiles": "diagnostics",
    # adapters
    "SafetyFinding": "adapters",
    "check_peft_compile_safety": "adapters",
    "compile_peft": "adapters",
}

__all__ = sorted([*_EXPORTS, "__version__"])


def __getattr__(name: str) -> Any:
    module_name = _EXPORTS.get(name)
    if module_name is None:
        raise AttributeError(f"module 'torchcompile_kit' has no attribute {name!r}")
    value = getattr(importlib.import_module(f".{module_name}", __name__), name)
    globals()[name] = value  # later lookups skip __getattr__
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_EXPORTS})
