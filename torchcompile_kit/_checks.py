"""Argument checks shared by every topic: one wording for "must be one of" and "positive int",
raising the caller's error class with the argument, the value and what would be accepted.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable
from typing import Any, TypeVar

import torch
from torch import nn

__all__ = ["check_choice", "check_flag", "check_module", "check_positive_int", "parameters_of"]

T = TypeVar("T")


def check_choice(
    name: str,
    value: T,
    choices: Collection[T],
    *,
    error: type[Exception] = ValueError,
    hint: str = "",
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


def check_flag(name: str, value: Any, *, caller: str, meaning: str) -> bool:
    """``value`` if it is ``True`` or ``False``, else ``TypeError`` naming the call and the flag.

    A string such as ``"yes"`` or ``"false"`` is refused: it is truthy whatever it says.

    Example:
        >>> check_flag("precompile", True, caller="compile_regional", meaning="save traced code")
        True
    """
    if isinstance(value, bool):
        return value
    raise TypeError(
        f"{caller}: {name}={value!r} must be True or False ({meaning}); got {type(value).__name__}"
    )


def check_module(name: str, value: Any) -> nn.Module:
    """``value`` if it is an ``nn.Module``, else ``TypeError`` saying what was passed instead."""
    if not isinstance(value, nn.Module):
        raise TypeError(
            f"{name} must be a torch.nn.Module, got {type(value).__name__} "
            f"({value!r:.80}); pass the model object itself."
        )
    return value


def parameters_of(value: Any, *, what: str) -> Iterable[torch.Tensor]:
    """The parameters of a module, of an optimizer's groups, or an iterable of them as given.

    ``what`` names the argument in the ``TypeError`` for anything else (``"zero_grads_in_place"``).

    Example:
        >>> len(list(parameters_of(nn.Linear(2, 1), what="model")))
        2
    """
    if isinstance(value, nn.Module):
        return value.parameters()
    if isinstance(value, torch.optim.Optimizer):
        return (p for group in value.param_groups for p in group["params"])
    if isinstance(value, Iterable):
        return value
    raise TypeError(
        f"{what} takes an nn.Module, an optimizer or an iterable of parameters; got "
        f"{type(value).__name__!r}"
    )
