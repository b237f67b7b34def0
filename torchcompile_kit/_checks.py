"""Argument checks shared by every topic: one wording for "must be one of" and "positive int".

Each check returns the value it accepted and raises the error class the caller names (every
error of this package is also a ``ValueError``/``TypeError``), with the argument, the offending
value (``!r``) and what would be accepted.
"""

from __future__ import annotations

from collections.abc import Collection
from typing import Any, TypeVar

from torch import nn

__all__ = ["check_choice", "check_module", "check_positive_int"]

T = TypeVar("T")


def check_choice(
    name: str, value: T, choices: Collection[T], *, error: type[Exception] = ValueError, hint: str = ""
) -> T:
    """``value`` if it is one of ``choices``, else ``error`` naming the argument and the choices.

    Example:
        >>> check_choice("impl", "step", ("step", "foreach_map"))
        'step'
    """
    if value not in choices:
        message = f"{name}={value!r} is not one of {tuple(choices)!r}"
        raise error(f"{message}; {hint}" if hint else message)
    return value


def check_positive_int(name: str, value: Any, *, error: type[Exception] = ValueError) -> int:
    """``value`` if it is an int >= 1 (``bool`` is refused), else ``error`` naming it.

    Example:
        >>> check_positive_int("max_buckets", 8)
        8
    """
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise error(f"{name} must be a positive int, got {value!r}")
    return value


def check_module(name: str, value: Any) -> nn.Module:
    """``value`` if it is an ``nn.Module``, else ``TypeError`` saying what was passed instead."""
    if not isinstance(value, nn.Module):
        raise TypeError(
            f"{name} must be a torch.nn.Module, got {type(value).__name__} ({value!r:.80}); "
            "pass the model object itself."
        )
    return value
