"""The one undo registry: what a helper installs next to an in-place compile, and how to remove it.

Every helper that changes a user's object in place (the ``use_cache`` hook, the pinned loss,
``compile_peft``'s runtime checks, ``compile_optimizer``'s step) registers how to remove it with
:func:`register_undo`; :func:`~torchcompile_kit.uncompile` runs them in reverse. It lives in the
ground because models (``regional``, ``adapters``) and optimizers (``optim``) both use it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

__all__ = ["has_undo", "register_undo", "run_undo"]

UNDO_ATTR = "_torchcompile_kit_undo"


def register_undo(target: Any, undo: Callable[[], None]) -> None:
    """Run ``undo`` (reverse order of registration) when :func:`~torchcompile_kit.uncompile` is
    called on ``target``: for helpers that install hooks or wrapped methods next to an in-place
    compile."""
    target.__dict__.setdefault(UNDO_ATTR, []).append(undo)


def has_undo(target: Any) -> bool:
    """Whether a helper registered something to undo on ``target``."""
    return bool(getattr(target, "__dict__", {}).get(UNDO_ATTR))


def run_undo(target: Any) -> None:
    """Run and forget every undo registered on ``target``, last first."""
    for undo in reversed(target.__dict__.pop(UNDO_ATTR, [])):
        undo()
