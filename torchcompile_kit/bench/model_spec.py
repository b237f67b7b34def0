"""``--model module:function``: the user's own model for ``bench`` and ``tune``.

``function()`` returns ``(model, make_batch[, lengths[, optimizer]])``; the contract is in
docs/benchmarks.md ("Your own model: --model"). The spec is a string on purpose: each recipe runs in
its own process, which loads it again from the string.
"""

from __future__ import annotations

import importlib.util
import os
import sys
import sysconfig
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .._factory import import_factory, parse_factory
from ..errors import TorchCompileKitError

__all__ = [
    "ModelSpec",
    "ModelSpecError",
    "load_model_spec",
    "loss_of",
    "parse_model_spec",
    "portable_model_spec",
]


class ModelSpecError(TorchCompileKitError, ValueError):
    """A ``--model`` spec is malformed, does not import, or its function returns the wrong thing."""


@dataclass(kw_only=True, slots=True)
class ModelSpec:
    """A model and its batches, as the bench's recipes consume them."""

    source: str
    """The spec string it was loaded from (``"mypkg.models:build"``), or ``"captioner:<preset>"``.
    """
    model: Any
    """The ``nn.Module`` to train."""
    make_batch: Callable[[int], dict[str, Any]]
    """``make_batch(step)`` -> the batch of that step, a dict ``model(**batch)`` accepts."""
    lengths: list[int] | None = None
    """The dataset's sequence lengths (optional; bucket recipes need them)."""
    optimizer: Any = None
    """The user's ``torch.optim.Optimizer`` over ``model.parameters()`` (optional; the recipes'
    ``Adam(lr=1e-4)`` without it)."""
    extras: dict[str, Any] = field(default_factory=dict)
    """Anything else a builder wants to pass to the recipes (unused for user models)."""


def parse_model_spec(text: str) -> tuple[str, str]:
    """``"module:function"`` as ``(module, function)``, or ``ModelSpecError``.

    Example:
        >>> parse_model_spec("mypkg.models:build")
        ('mypkg.models', 'build')
    """
    return parse_factory(text, error=ModelSpecError)


def load_model_spec(text: str) -> ModelSpec:
    """Import ``module``, call ``function()`` and check what it returns: the :class:`ModelSpec`, or
    ``ModelSpecError`` saying what is wrong with the spec, the import, the call or its return."""
    function = import_factory(text, error=ModelSpecError)
    function_name = parse_model_spec(text)[1]
    try:
        returned = function()
    except Exception as err:
        raise ModelSpecError(
            f"--model {text!r}: {function_name}() raised {type(err).__name__}: {err}"
        ) from err
    return _check_returned(text, returned)


def _check_returned(text: str, returned: Any) -> ModelSpec:
    from torch import nn

    shape = (
        "(model, make_batch), (model, make_batch, lengths) or "
        "(model, make_batch, lengths, optimizer)"
    )
    if not isinstance(returned, tuple) or len(returned) not in (2, 3, 4):
        raise ModelSpecError(
            f"--model {text!r} returned {type(returned).__name__} "
            f"({' '.join(repr(returned).split())[:60]}); it must return {shape}"
        )
    model, make_batch, *rest = returned
    if not isinstance(model, nn.Module):
        raise ModelSpecError(
            f"--model {text!r}: the first item must be a torch.nn.Module, got "
            f"{type(model).__name__}; it must return {shape}"
        )
    if not callable(make_batch):
        raise ModelSpecError(
            f"--model {text!r}: the second item must be make_batch(step) -> "
            f"dict, got {type(make_batch).__name__}"
        )
    lengths = None
    if rest and rest[0] is not None:
        lengths = _check_lengths(text, rest[0])
    optimizer = _check_optimizer(text, model, rest[1]) if len(rest) == 2 else None
    batch = make_batch(0)
    if not isinstance(batch, dict):
        raise ModelSpecError(
            f"--model {text!r}: make_batch(0) returned {type(batch).__name__}; "
            "it must return a dict that model(**batch) accepts"
        )
    return ModelSpec(
        source=text, model=model, make_batch=make_batch, lengths=lengths, optimizer=optimizer
    )


def _check_optimizer(text: str, model: Any, optimizer: Any) -> Any:
    import torch

    if optimizer is None:
        return None
    if not isinstance(optimizer, torch.optim.Optimizer):
        raise ModelSpecError(
            f"--model {text!r}: the fourth item must be the "
            "torch.optim.Optimizer to train with, got "
            f"{type(optimizer).__name__}; return (model, make_batch, "
            "lengths_or_None, optimizer)"
        )
    owned = {id(p) for p in model.parameters()}
    foreign = sum(id(p) not in owned for group in optimizer.param_groups for p in group["params"])
    if foreign:
        raise ModelSpecError(
            f"--model {text!r}: {foreign} of the optimizer's parameters are not "
            "the model's; build it on model.parameters() of the model you "
            "return (e.g. torch.optim.AdamW(model.parameters(), lr=3e-4))"
        )
    return optimizer


def _check_lengths(text: str, lengths: Any) -> list[int]:
    if not isinstance(lengths, Sequence) and not hasattr(lengths, "tolist"):
        raise ModelSpecError(
            f"--model {text!r}: the third item must be the dataset's lengths (a "
            f"list of ints), got {type(lengths).__name__}"
        )
    values = lengths.tolist() if hasattr(lengths, "tolist") else list(lengths)
    if not values or not all(isinstance(v, int) and v > 0 for v in values):
        raise ModelSpecError(
            f"--model {text!r}: lengths must be a non-empty list of positive "
            f"ints, got {values[:5]!r}..."
        )
    return values


def portable_model_spec(text: str) -> tuple[str, str | None]:
    """``(spec, sys_path_entry)``: the spec as a script started from any directory loads it again.

    A file spec gets its absolute path; a module spec keeps its name, with the ``sys.path`` entry it
    imports from here (``None`` for an installed module or a namespace package). ``ModelSpecError``
    when the spec is malformed or its module cannot be found.

    Example:
        >>> portable_model_spec("torchcompile_kit.tuning.examples:tiny_llama")[0]
        'torchcompile_kit.tuning.examples:tiny_llama'
    """
    module, function = parse_model_spec(text)
    if module.endswith(".py") or os.sep in module or "/" in module:
        return f"{Path(module).resolve()}:{function}", None
    if "" not in sys.path and os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())  # as _import does
    try:
        found = importlib.util.find_spec(module)
    except (ImportError, ValueError) as err:
        raise ModelSpecError(f"--model {text!r}: cannot find module {module!r} ({err})") from err
    if found is None or not found.origin or not Path(found.origin).is_file():
        if found is None:
            raise ModelSpecError(
                f"--model {text!r}: cannot find module {module!r}; run from the "
                "directory that contains it, or pass a path: --model "
                "path/file.py:fn"
            )
        return text, None
    origin = Path(found.origin).resolve()
    depth = module.count(".") + (1 if found.submodule_search_locations is not None else 0)
    root = origin.parents[depth]
    installed = {
        str(Path(p).resolve())
        for key in ("purelib", "platlib", "stdlib", "platstdlib")
        if (p := sysconfig.get_paths().get(key))
    }
    return text, None if str(root) in installed else str(root)


def loss_of(output: Any) -> Any:
    """The loss tensor of a model output (``output.loss``, ``output["loss"]`` or ``output``), or
    ``ModelSpecError``.

    Example:
        >>> loss_of({"loss": 1.0})
        1.0
    """
    loss = getattr(output, "loss", None)
    if loss is None and isinstance(output, dict):
        loss = output.get("loss")
    if loss is None and hasattr(output, "backward") and getattr(output, "ndim", 1) == 0:
        loss = output
    if loss is None:
        raise ModelSpecError(
            f"model(**batch) returned {type(output).__name__} without a loss; "
            "return an output with .loss (pass labels in the batch), a dict "
            "with 'loss', or the scalar loss"
        )
    return loss
