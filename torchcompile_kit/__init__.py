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
    "CompiledMismatchError": "errors",
    "NoRepeatedBlocksError": "errors",
    "SequenceTooLongError": "errors",
    "TorchCompileKitError": "errors",
    "UnexpectedRecompileError": "errors",
    "UnsafeAdapterConfigError": "errors",
    "UnsafeCompileModeError": "errors",
    "UnsupportedOptimizerError": "errors",
    "UnsupportedTorchError": "errors",
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
    "expected_padding": "shapes",
    "mark_dynamic_batch": "shapes",
    "pad_to_bucket": "shapes",
    "plan_buckets": "shapes",
    "warmup_shapes": "shapes",
    # diagnostics
    "CompileMonitor": "diagnostics",
    "EquivalenceReport": "diagnostics",
    "EquivalenceStep": "diagnostics",
    "check_compile_equivalence": "diagnostics",
    "explain_graph_breaks": "diagnostics",
    "no_recompiles": "diagnostics",
    # cache
    "CacheLoadResult": "cache",
    "CacheSaveResult": "cache",
    "CompileCacheSession": "cache",
    "CompileCacheWarning": "cache",
    "compile_cache": "cache",
    "load_compile_cache": "cache",
    "save_compile_cache": "cache",
    # adapters
    "PeftCompileRecord": "adapters",
    "SafetyFinding": "adapters",
    "check_peft_compile_safety": "adapters",
    "compile_peft": "adapters",
    "get_peft_compile_record": "adapters",
    # integrations (CompileTrainer, a transformers.Trainer subclass, stays in
    # torchcompile_kit.integrations: touching it imports transformers)
    "CompileTrainerMixin": "integrations",
    "apply_fsdp2_regional": "integrations",
    "enable_activation_checkpointing": "integrations",
    "prepare_bucket_dataloader": "integrations",
    # tune
    "TuneResult": "tuning",
    "tune": "tuning",
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
