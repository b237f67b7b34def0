"""The comparator's reference: the same step run eagerly at higher precision.

float64 for a model whose step runs in float32; float32 for one whose step runs lower (autocast,
16-bit parameters), which is far more precise than either run and half the memory of float64. The
reference runs with autocast off, the model's floating parameters and buffers cast in place for the
duration (the same ``Parameter`` objects, so tied weights stay tied and gradients are taken with
respect to them), its floating inputs cast with their strides kept, and the same RNG state as eager
(dropout draws the same mask at any precision). A model that cannot run at the reference precision
(a kernel without float64, a tensor cached outside its parameters) has no reference, and the check
says so (:attr:`Reference.note`) and judges by the fixed tolerance instead.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from itertools import chain
from typing import Any

import torch
from torch import nn

from .comparator import FACTOR, NEAR_EPS

__all__ = [
    "Reference",
    "at_precision",
    "autocast_active",
    "cast_floating",
    "casting_inputs",
    "reference_dtype",
]

_LOW = frozenset({torch.float16, torch.bfloat16})


@dataclass(kw_only=True, frozen=True, slots=True)
class Reference:
    """Which reference a check judged by."""

    dtype: torch.dtype | None
    """The reference's precision; ``None`` when there is none (judged by fixed tolerances)."""
    note: str = ""
    """Why there is none, when there is none."""
    needed: bool = True
    """``False`` when it was not run: every compiled tensor was rounding-level near eager."""

    @property
    def name(self) -> str:
        """``"float64"``, ``"float32"`` or ``""``."""
        return str(self.dtype).removeprefix("torch.") if self.dtype is not None else ""

    def describe(self) -> str:
        """What the check was judged against, in words.

        Example:
            >>> Reference(dtype=torch.float64).describe()
            'eager in float64 with autocast off (compiled may be 3x farther from it than eager)'
        """
        if not self.needed:
            return (
                f"eager: every tensor within {NEAR_EPS:g} epsilons of it (rounding-level), so "
                "no reference was needed"
            )
        if self.dtype is None:
            return f"no reference ({self.note}): judged by a fixed tolerance"
        return (
            f"eager in {self.name} with autocast off (compiled may be {FACTOR:g}x farther "
            "from it than eager)"
        )


def autocast_active(model: nn.Module) -> bool:
    """Whether autocast is on for the CPU or a device ``model``'s parameters are on.

    Example:
        >>> with torch.autocast("cpu", dtype=torch.bfloat16):
        ...     autocast_active(torch.nn.Linear(2, 2))
        True
    """
    return any(torch.is_autocast_enabled(kind) for kind in _device_types(model))


def reference_dtype(
    source: nn.Module | Iterable[torch.Tensor], *, autocast: bool = False
) -> Reference:
    """The reference precision for a step of a model, or of a step over ``source``'s tensors (an
    optimizer's parameters and state): the one rule of the module's docstring.

    Example:
        >>> reference_dtype(torch.nn.Linear(2, 2)).dtype
        torch.float64
        >>> reference_dtype(torch.nn.Linear(2, 2), autocast=True).dtype
        torch.float32
        >>> reference_dtype([torch.ones(2, dtype=torch.bfloat16)]).dtype
        torch.float32
    """
    module = isinstance(source, nn.Module)
    tensors = chain(source.parameters(), source.buffers()) if module else source
    dtypes = {t.dtype for t in tensors if t.is_floating_point()}
    if autocast or dtypes & _LOW:
        return Reference(dtype=torch.float32)
    if dtypes <= {torch.float32}:
        return Reference(dtype=torch.float64)
    shown = ", ".join(sorted(str(d).removeprefix("torch.") for d in dtypes))
    what = "the model's parameters are" if module else "the tensors are"
    return Reference(dtype=None, note=f"{what} {shown}: nothing runs more precisely")


@contextlib.contextmanager
def at_precision(model: nn.Module, dtype: torch.dtype) -> Iterator[None]:
    """Run ``model`` in ``dtype`` with autocast off; everything is put back on exit.

    Floating parameters and buffers get ``dtype`` copies of their data in place (``.data`` swapped,
    so the objects, ties and ``requires_grad`` stay); their ``.grad`` is set aside meanwhile.

    Example:
        >>> layer = torch.nn.Linear(2, 2)
        >>> with at_precision(layer, torch.float64):
        ...     layer(torch.ones(1, 2, dtype=torch.float64)).dtype
        torch.float64
        >>> layer.weight.dtype
        torch.float32
    """
    swapped: list[tuple[torch.Tensor, torch.Tensor, Any]] = []
    seen: set[int] = set()
    try:
        with torch.no_grad():
            for tensor in chain(model.parameters(), model.buffers()):
                if id(tensor) in seen or not tensor.is_floating_point() or tensor.dtype == dtype:
                    continue
                seen.add(id(tensor))
                swapped.append((tensor, tensor.data, tensor.grad))
                tensor.grad = None
                tensor.data = tensor.data.to(dtype)
        with contextlib.ExitStack() as stack:
            for kind in _device_types(model):
                stack.enter_context(torch.autocast(kind, enabled=False))
            yield
    finally:
        for tensor, data, grad in reversed(swapped):
            tensor.data = data
            tensor.grad = grad


def cast_floating(tree: Any, dtype: torch.dtype) -> Any:
    """``tree`` with its floating tensors cast to ``dtype`` (strides kept); other leaves as they
    are.

    Example:
        >>> cast_floating({"x": torch.ones(1), "ids": torch.ones(1, dtype=torch.long)},
        ...     torch.float64)
        {'x': tensor([1.], dtype=torch.float64), 'ids': tensor([1])}
    """
    if isinstance(tree, torch.Tensor):
        return tree.to(dtype) if tree.is_floating_point() else tree
    if isinstance(tree, Mapping):
        return {key: cast_floating(value, dtype) for key, value in tree.items()}
    if isinstance(tree, tuple) and not hasattr(tree, "_fields"):
        return tuple(cast_floating(value, dtype) for value in tree)
    if isinstance(tree, list):
        return [cast_floating(value, dtype) for value in tree]
    return tree


@contextlib.contextmanager
def casting_inputs(model: nn.Module, dtype: torch.dtype) -> Iterator[None]:
    """While inside, every call of ``model`` gets its floating inputs cast to ``dtype`` (for runs
    whose inputs are held by the caller's code, such as a sequence of steps).

    Example:
        >>> layer = torch.nn.Linear(2, 2).double()
        >>> with casting_inputs(layer, torch.float64):
        ...     layer(torch.ones(1, 2)).dtype
        torch.float64
    """

    def cast(module: nn.Module, args: tuple, kwargs: dict) -> tuple[tuple, dict]:
        return cast_floating(args, dtype), cast_floating(kwargs, dtype)

    handle = model.register_forward_pre_hook(cast, with_kwargs=True, prepend=True)
    try:
        yield
    finally:
        handle.remove()


def _device_types(model: nn.Module) -> list[str]:
    kinds = {"cpu"} | {p.device.type for p in model.parameters()}
    return sorted(kind for kind in kinds if torch.amp.is_autocast_available(kind))
