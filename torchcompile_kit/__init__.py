"""torchcompile_kit: make ``torch.compile`` pay off in real training loops.

Importing it is cheap (no torch, transformers, peft or accelerate) and changes no setting; each
public name is loaded from its topic folder on first use (PEP 562; docs/architecture.md).
"""

from __future__ import annotations

import importlib
from typing import Any

__version__ = "0.3.0"

# public name -> module that defines it (relative to this package). A name is here when a training
# script calls or constructs it to apply, check or measure a recipe (docs/architecture.md gives
# each one's reason); the types those calls return, the helpers around them and every error but
# the base are imported from their topic (torchcompile_kit.regional, .errors, ...).
_EXPORTS: dict[str, str] = {
    name: topic
    for topic, names in (
        ("errors", "TorchCompileKitError"),
        (
            "regional",
            (
                "compile_in_background compile_model compile_regional expect_shapes "
                "fix_loss_function "
                "get_regional_plan uncompile"
            ),
        ),
        ("optim", "compile_optimizer"),
        (
            "shapes",
            (
                "Batching BucketBatchSampler PadToBucketCollator mark_dynamic_batch pad_to_bucket "
                "plan_buckets warmup_shapes"
            ),
        ),
        (
            "diagnostics",
            (
                "CompileMonitor EquivalenceStep check_compile_equivalence "
                "explain_graph_breaks no_recompiles"
            ),
        ),
        ("cache", "compile_cache load_compile_cache save_compile_cache"),
        ("adapters", "check_peft_compile_safety compile_peft"),
        ("tuning", "tune"),
    )
    for name in names.split()
}
_TOPICS = (
    "errors",
    "regional",
    "optim",
    "shapes",
    "diagnostics",
    "cache",
    "adapters",
    "integrations",
    "tuning",
    "doctor",
)

__all__ = sorted([*_EXPORTS, "__version__"])  # noqa: PLE0605 - built from _EXPORTS, one place


def __getattr__(name: str) -> Any:
    module_name = _EXPORTS.get(name)
    if module_name is None:
        topic = _topic_of(name)
        if topic is not None:
            raise AttributeError(
                f"torchcompile_kit.{name} is imported from its topic: "
                f"from torchcompile_kit.{topic} import {name}"
            )
        raise AttributeError(f"module 'torchcompile_kit' has no attribute {name!r}")
    value = getattr(importlib.import_module(f".{module_name}", __name__), name)
    globals()[name] = value  # later lookups skip __getattr__
    return value


def _topic_of(name: str) -> str | None:
    """The topic that exports ``name`` (only when the top level does not: an error's hint)."""
    if name.startswith("_"):
        return None
    for topic in _TOPICS:
        try:
            module = importlib.import_module(f".{topic}", __name__)
        except ImportError:  # a topic whose optional dependency is missing
            continue
        if name in getattr(module, "__all__", ()):
            return topic
    return None


def __dir__() -> list[str]:
    return sorted({*globals(), *_EXPORTS})
