"""Comparing an eager and a compiled run, tensor by tensor: :class:`TensorDiff` and the tolerances.

Shared by :mod:`.equivalence` (the user's check) and :mod:`.first_call` (the recipes' own check at
their first compiled call).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch

__all__ = ["TensorDiff", "compare_tensors", "compare_trees", "leaves", "max_abs_difference"]

# (rtol, atol) per dtype: compiled kernels reorder reductions, so these are looser than
# torch.testing's defaults; measured inductor/eager gaps on the tiny test models are ~3e-7 (fp32).
_TOLERANCES: dict[torch.dtype, tuple[float, float]] = {torch.float64: (1e-7, 1e-7),
                                                       torch.float32: (1e-4, 1e-5),
                                                       torch.float16: (1e-2, 1e-3),
                                                       torch.bfloat16: (5e-2, 1e-2)}

@dataclass(kw_only=True, slots=True)
class TensorDiff:
    """How one tensor differs between the eager and the compiled run."""

    name: str
    """``output.logits``, ``loss``, ``grad.<param>``, ``param_after_step.<param>`` or
    ``output_after_step.<key>``."""
    max_abs: float
    """Largest absolute elementwise difference (``inf`` when missing on one side)."""
    max_rel: float
    """``max_abs`` divided by the largest magnitude of the eager tensor."""
    ratio: float
    """Largest ``|compiled - eager| / (atol + rtol * |eager|)``; at most 1 is within tolerance."""
    ok: bool
    note: str = ""
    """Why the tensors could not be compared elementwise (missing, shape, an exception), if so."""
    step: str = ""
    """The step of a sequence (``"2:mixed batch"``) that produced it; ``""`` for a single batch."""



def leaves(tree: Any, prefix: str = "") -> list[tuple[str, torch.Tensor]]:
    """The tensors of a nested output (dicts, tuples, lists, model outputs), named by their path."""
    if isinstance(tree, torch.Tensor):
        return [(prefix, tree)]
    join = (lambda key: f"{prefix}.{key}") if prefix else str
    if isinstance(tree, Mapping):
        return [leaf for key, value in tree.items() for leaf in leaves(value, join(key))]
    if isinstance(tree, (tuple, list)):
        return [leaf for i, value in enumerate(tree) for leaf in leaves(value, join(i))]
    return []  # caches and other objects are not compared


def compare_trees(prefix: str, eager: Any, compiled: Any, tolerance: tuple) -> list[TensorDiff]:
    """One :class:`TensorDiff` per tensor of two nested outputs; ``tolerance`` is ``(rtol, atol)``,
    ``None`` for the dtype's default; a tensor on one side only is a failure."""
    if eager is None or compiled is None:
        if eager is None and compiled is None:
            return []
        side = "compiled" if compiled is None else "eager"
        return [TensorDiff(name=prefix, max_abs=math.inf, max_rel=math.inf, ratio=math.inf,
                           ok=False, note=f"missing in the {side} run")]
    left, right = dict(leaves(eager)), dict(leaves(compiled))
    diffs = []
    for key in sorted(left.keys() | right.keys()):
        name = f"{prefix}.{key}" if key else prefix
        if key not in left or key not in right:
            side = "compiled" if key not in right else "eager"
            diffs.append(TensorDiff(name=name, max_abs=math.inf, max_rel=math.inf, ratio=math.inf,
                                    ok=False, note=f"missing in the {side} run"))
        else:
            diffs.append(compare_tensors(name, left[key], right[key], tolerance))
    return diffs


def compare_tensors(name: str, eager: torch.Tensor, compiled: torch.Tensor, tolerance: tuple) -> TensorDiff:
    """How far ``compiled`` is from ``eager``, elementwise, against the tolerance."""
    if eager.shape != compiled.shape:
        note = f"shape {tuple(compiled.shape)} != eager {tuple(eager.shape)}"
        return TensorDiff(name=name, max_abs=math.inf, max_rel=math.inf, ratio=math.inf, ok=False, note=note)
    default_rtol, default_atol = _TOLERANCES.get(eager.dtype, (0.0, 0.0))  # integers: exact
    rtol = default_rtol if tolerance[0] is None else tolerance[0]
    atol = default_atol if tolerance[1] is None else tolerance[1]
    a, b = eager.detach().double().cpu(), compiled.detach().double().cpu()
    diff = (a - b).abs()
    diff[a.isnan() & b.isnan()] = 0.0
    diff = diff.nan_to_num(nan=math.inf)
    if diff.numel() == 0:
        return TensorDiff(name=name, max_abs=0.0, max_rel=0.0, ratio=0.0, ok=True)
    max_abs = diff.max().item()
    scale = a.abs().nan_to_num(nan=0.0, posinf=0.0).max().item()
    bound = atol + rtol * a.abs().nan_to_num(nan=0.0)
    ratio = torch.where(diff == 0, 0.0, diff / bound).max().item()  # x/0 is inf: exact dtypes
    max_rel = max_abs / scale if scale > 0 else (0.0 if max_abs == 0 else math.inf)
    return TensorDiff(name=name, max_abs=max_abs, max_rel=max_rel, ratio=ratio, ok=ratio <= 1.0)


def max_abs_difference(first: Any, second: Any) -> float:
    """The largest elementwise difference between the tensors two nested outputs share."""
    right = dict(leaves(second))
    return max(
        ((t.detach().double() - right[k].detach().double()).abs().max().item()
         for k, t in leaves(first) if k in right and t.shape == right[k].shape and t.numel()),
        default=0.0,
    )
