"""``zero_grads_in_place``: zero gradients in place, keeping their storage (for static-address
steps)."""

from __future__ import annotations

from collections.abc import Iterable

import torch

from .._checks import parameters_of

__all__ = ["zero_grads_in_place"]


def zero_grads_in_place(
    model: torch.nn.Module | torch.optim.Optimizer | Iterable[torch.Tensor],
) -> None:
    """Zero every existing gradient in place, keeping its storage (``None`` grads stay ``None``).

    For CUDA graphs with ``compile_optimizer(..., static_grads=True)``: a gradient at a new address
    (``zero_grad()`` sets them to ``None``) means a copy. On CPU, or without CUDA graphs,
    ``zero_grad()`` is as good and uses less memory. ``model`` is a module, an optimizer or an
    iterable of parameters (``TypeError`` otherwise).

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
