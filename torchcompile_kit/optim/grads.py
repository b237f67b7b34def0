"""``zero_grads_in_place``: zero gradients in place, keeping their storage (for static-address steps)."""

from __future__ import annotations

from collections.abc import Iterable

import torch

from .._checks import parameters_of

__all__ = ["zero_grads_in_place"]


def zero_grads_in_place(model: torch.nn.Module | torch.optim.Optimizer | Iterable[torch.Tensor]) -> None:
    """Zero every existing gradient in place, keeping its storage (``None`` grads stay ``None``).

    ``zero_grad()`` sets gradients to ``None`` by default, so backward allocates new ones at new
    addresses every step. With ``compile_optimizer(..., static_grads=True)`` and CUDA graphs the
    gradients are static inputs, and a new address means a copy (or a re-recording); zeroing in
    place keeps the address. One ``torch._foreach_zero_`` call per step. On CPU, or without
    CUDA graphs, ``zero_grad()`` (set to ``None``) is as good and uses less memory between steps.

    Args:
        model: a module, an optimizer, or an iterable of parameters whose ``.grad`` to zero.

    Returns:
        None.

    Raises:
        TypeError: if ``model`` is none of the above.

    Example:
        >>> model = torch.nn.Linear(2, 1)
        >>> model(torch.ones(1, 2)).sum().backward()
        >>> zero_grads_in_place(model)
        >>> float(model.weight.grad.abs().sum())
        0.0
    """
    params = parameters_of(model, what="zero_grads_in_place")
    grads = [p.grad for p in params if p.grad is not None]
    if grads:
        torch._foreach_zero_(grads)
