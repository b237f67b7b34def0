"""The optimizer's private pieces: ``foreach_map`` and the PrivateUse1 name.

Part of the one door to torch's private compiler APIs (see ``_dynamo/__init__.py``)."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import torch

__all__ = ["foreach_map_op", "privateuse1_backend_name"]


# --- optimizer pieces ------------------------------------------------------------------------


@functools.cache
def foreach_map_op() -> Callable[..., Any]:
    """``torch._higher_order_ops.foreach_map.foreach_map``.

    Why: the horizontally fused optimizer step is built on it; it has no public name yet.
    Upstream: https://github.com/pytorch/pytorch/pull/142098 (the HOP), documented as beta in the
    torch 2.7 recipe "Explicit horizontal fusion with foreach_map" (pytorch/tutorials#3318). Can go
    when it is exported publicly.
    """
    from torch._higher_order_ops.foreach_map import foreach_map

    return foreach_map


def privateuse1_backend_name() -> str:
    """The name a PrivateUse1 device registered under (``torch._C``), for device checks.

    Why: ``compile_optimizer`` sets ``capturable=True`` on accelerator devices, including
    out-of-tree ones registered as PrivateUse1. Upstream: no public getter for the name exists
    (``torch.utils.rename_privateuse1_backend`` sets it). Can go when one does.
    """
    return torch._C._get_privateuse1_backend_name()
