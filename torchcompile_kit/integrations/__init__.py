"""Drop-in use where users already train: HF Trainer, accelerate, DDP and FSDP2.

transformers and accelerate are imported only where used; docs/integrations.md has a runnable
example for each and the pitfalls they handle.
"""

from __future__ import annotations

from typing import Any

from .accelerate import prepare_bucket_dataloader
from .distributed import apply_fsdp2_regional, enable_activation_checkpointing
from .trainer import CompileTrainerMixin

# HF Trainer: CompileTrainer, CompileTrainerMixin; accelerate: prepare_bucket_dataloader;
# DDP / FSDP2: apply_fsdp2_regional, enable_activation_checkpointing
__all__ = [
    "CompileTrainer",
    "CompileTrainerMixin",
    "apply_fsdp2_regional",
    "enable_activation_checkpointing",
    "prepare_bucket_dataloader",
]


def __getattr__(name: str) -> Any:
    if name == "CompileTrainer":  # subclasses transformers.Trainer: imported on first use
        from . import trainer

        return trainer.CompileTrainer
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
