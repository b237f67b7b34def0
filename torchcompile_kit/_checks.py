"""Argument checks shared by every topic: one wording for "must be one of" and "positive int",
raising the caller's error class with the argument, the value and what would be accepted; one
meaning per flag; one check of the keywords a call passes on to ``torch.compile``.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Collection, Iterable, Mapping
from typing import Any, TypeVar

import torch
from torch import nn

from .errors import UnsupportedTorchError

__all__ = [
    "FLAGS",
    "PER_CALL_KWARGS",
    "check_choice",
    "check_compile_kwargs",
    "check_flag",
    "check_module",
    "check_positive_int",
    "parameters_of",
]

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


FLAGS = {
    "verify": "compare the first call in each state with eager",
    "precompile": "save the traced code with the compile cache, so a restart does not trace",
}
"""The flags the compile recipes take, and the one meaning each has in every recipe."""


def check_flag(name: str, value: Any, *, caller: str) -> bool:
    """``value`` if it is ``True`` or ``False``, else ``TypeError`` naming the call, the flag and
    what it means (:data:`FLAGS`).

    A string such as ``"yes"`` or ``"false"`` is refused: it is truthy whatever it says.

    Example:
        >>> check_flag("precompile", True, caller="compile_regional")
        True
    """
    if isinstance(value, bool):
        return value
    raise TypeError(
        f"{caller}: {name}={value!r} must be True or False ({FLAGS[name]}); "
        f"got {type(value).__name__}"
    )


PER_CALL_KWARGS = ("recompile_limit", "isolate_recompiles")
"""``torch.compile`` keywords that only some torches in the tested window take (2.13 and newer):
``_dynamo.recompile_limit_kwarg`` and ``isolated_cache_kwarg`` say where they came from."""


def check_compile_kwargs(
    compile_kwargs: Mapping[str, Any],
    *,
    caller: str,
    flags: Mapping[str, Any] | None = None,
    takes: Collection[str] = (),
    compile_fn: Callable[..., Any] | None = None,
) -> None:
    """The keywords a call passes on to ``torch.compile``, checked before anything is copied or
    compiled (torch would raise after part of the model was): ``TypeError`` for one that neither
    the caller (``takes``) nor ``torch.compile`` takes (a removed one is refused before that, with
    its replacement: ``_moved.py``); ``UnsupportedTorchError`` for a per-call one
    (:data:`PER_CALL_KWARGS`) this torch's ``torch.compile`` lacks. The caller's ``flags`` (name:
    value) are checked with them (:func:`check_flag`). ``compile_fn`` stands in for
    ``torch.compile`` (tests).

    Example:
        >>> check_compile_kwargs({"backend": "eager"}, caller="compile", flags={"verify": True})
    """
    for name, value in (flags or {}).items():
        check_flag(name, value, caller=caller)
    params = inspect.signature(compile_fn or torch.compile).parameters
    for name, value in compile_kwargs.items():
        if name in PER_CALL_KWARGS and name not in params:
            raise UnsupportedTorchError(
                f"{caller}({name}={value!r}): torch {torch.__version__}'s torch.compile takes no "
                f"per-call {name}= (torch 2.13 and newer do). Drop it, "
                + (
                    "or raise the limit for the whole process around your loop with "
                    "torch._dynamo.config.patch(recompile_limit=N), or upgrade torch."
                    if name == "recompile_limit"
                    else "or upgrade torch."
                )
            )
        if name not in params and name not in PER_CALL_KWARGS and name not in takes:
            raise TypeError(
                f"{caller}: unexpected keyword {name}=; it is not one of {caller}'s and "
                f"torch.compile takes {', '.join(p for p in params if p != 'model')}"
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
