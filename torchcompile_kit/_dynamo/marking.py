"""Marking tensors dynamic or static-address, and resetting dynamo.

Part of the one door to torch's private compiler APIs (see ``_dynamo/__init__.py``)."""

from __future__ import annotations

import torch

__all__ = ["mark_dynamic", "mark_static_address", "reset"]


# --- marking tensors ------------------------------------------------------------------------
# Why: `torch._dynamo.mark_dynamic` / `mark_static_address` are the documented way to mark dims and
# addresses, but live under the private `torch._dynamo` namespace; the move of dynamo's user APIs to
# the public `torch.compiler` (https://github.com/pytorch/pytorch/pull/102182) did not take them.
# Can go when `torch.compiler` has both.


def mark_dynamic(
    tensor: torch.Tensor, dim: int, *, min: int | None = None, max: int | None = None
) -> None:
    """``torch._dynamo.mark_dynamic`` with its ``min``/``max`` bounds."""
    torch._dynamo.mark_dynamic(tensor, dim, min=min, max=max)


def mark_static_address(tensor: torch.Tensor) -> None:
    """``torch._dynamo.mark_static_address``: the address is a guard, not a graph input copy."""
    torch._dynamo.mark_static_address(tensor)


def reset() -> None:
    """Forget every compiled graph and guard (a cold start): the public ``torch.compiler.reset``."""
    torch.compiler.reset()
