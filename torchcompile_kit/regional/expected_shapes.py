"""The batch shapes a run will feed, told to a regionally compiled model before its first step:
the graphs predicted and the recompile limits sized for them (:func:`expect_shapes`).

With ``dynamic=False`` every bucket shape is a graph of each block, and an evaluation under
``torch.no_grad()`` is a graph per shape again (dynamo guards the grad mode). Eight buckets fill
dynamo's default limit of 8 in training alone; the evaluation then runs eagerly. Told the shapes,
the plan predicts shapes x modes x variants and raises the limit of each compiled region to
that, only while its calls run.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Literal

from torch import nn

from .._checks import check_module
from .plan import ExpectedShapes, RegionalPlan, get_regional_plan
from .preflight import size_recompile_limits

__all__ = ["expect_shapes"]

_MODES = ("train", "eval")


def expect_shapes(
    model: nn.Module, shapes: Any, *, mode: Literal["train", "eval"] = "train"
) -> RegionalPlan:
    """Tell a ``compile_regional`` model the batch shapes it will run in one mode.

    The plan then predicts each group's graphs for them (its variants x shapes x modes; with
    ``dynamic=False`` one per shape, by default an upper bound) and sizes the recompile limit of
    every compiled region (blocks, the loss) for training and evaluation together, raised only
    while its calls run, on every torch of the window. Calls add up: tell the training shapes
    and the evaluation shapes, in any order, before or after the first step (the limit is read at
    every call). Without evaluation shapes, evaluation is assumed to feed the training shapes.
    ``CompileTrainer`` calls it with its sampler and its evaluation data.

    Args:
        model: a model ``compile_regional`` compiled.
        shapes: a :class:`~torchcompile_kit.BucketBatchSampler` (its ``batch_shapes()``), a
            sequence of shapes (tuples of ints, e.g. ``(batch, length)``), or how many distinct
            shapes.
        mode: ``"train"`` (grad on) or ``"eval"`` (under ``torch.no_grad()``, as HF Trainer and
            most evaluation loops run).

    Returns:
        The model's :class:`RegionalPlan`, with :attr:`~RegionalPlan.expected` updated.

    Raises:
        TypeError: ``model`` is not an ``nn.Module``, or ``shapes`` is none of the above.
        ValueError: ``model`` was not compiled by ``compile_regional``, ``mode`` is unknown, or
            ``shapes`` is empty or holds a non-positive size.

    Example:
        >>> model = compile_regional(model, dynamic=False)  # doctest: +SKIP
        >>> sampler = BucketBatchSampler(lengths, buckets, batch_size=64,  # doctest: +SKIP
        ...     drop_last=True)
        >>> expect_shapes(model, sampler).summary()  # doctest: +SKIP
        'compiled 12 × GPT2Block; ...; expected shapes: 8 in training, 8 in evaluation (assumed)'
    """
    check_module("expect_shapes(model=...)", model)
    if mode not in _MODES:
        raise ValueError(
            f"expect_shapes(mode={mode!r}): use 'train' (grad on) or 'eval' (under torch.no_grad())"
        )
    plan = get_regional_plan(model)
    if plan is None or not any(group.compiled for group in plan.groups):
        raise ValueError(
            f"expect_shapes: {type(model).__name__} has no regional plan with "
            "compiled blocks; call compile_regional(model, ...) first"
        )
    told = _shapes(shapes)
    expected = plan.expected
    if mode == "train":
        plan.expected = ExpectedShapes(
            train=_union(expected.train, told), evaluation=expected.evaluation
        )
    else:
        plan.expected = ExpectedShapes(
            train=expected.train, evaluation=_union(expected.evaluation, told)
        )
    size_recompile_limits(plan)
    return plan


def _shapes(shapes: Any) -> tuple[tuple[int, ...], ...]:
    """The distinct shapes ``shapes`` stands for (a count stands for that many 1-D shapes)."""
    if callable(getattr(shapes, "batch_shapes", None)):
        sampler, shapes = shapes, shapes.batch_shapes()
        if not shapes:
            raise ValueError(
                f"expect_shapes: {type(sampler).__name__} yields no batch (fewer "
                "samples than batch_size, with drop_last=True?); the run would "
                "train on nothing"
            )
    if (
        isinstance(shapes, bool)
        or not isinstance(shapes, (int, Sequence))
        or isinstance(shapes, str)
    ):
        raise TypeError(
            f"expect_shapes: shapes={shapes!r:.80} is not a BucketBatchSampler, a "
            "sequence of shapes or a count; pass e.g. sampler, [(8, 128), (8, 256)] "
            "or 8"
        )
    if isinstance(shapes, int):
        if shapes < 1:
            raise ValueError(
                f"expect_shapes: shapes={shapes!r}; pass how many distinct shapes (>= 1)"
            )
        return tuple((-index,) for index in range(1, shapes + 1))  # distinct, never a real size
    result = []
    for index, shape in enumerate(shapes):
        if (
            not isinstance(shape, Sequence)
            or not shape
            or not all(
                isinstance(size, int) and not isinstance(size, bool) and size > 0 for size in shape
            )
        ):
            raise ValueError(
                f"expect_shapes: shapes[{index}] is {shape!r}; each shape is a "
                "non-empty tuple of positive ints, e.g. (batch, length)"
            )
        result.append(tuple(shape))
    if not result:
        raise ValueError("expect_shapes: shapes is empty; pass the shapes the run will feed")
    return tuple(dict.fromkeys(result))


def _union(
    known: tuple[tuple[int, ...], ...], told: tuple[tuple[int, ...], ...]
) -> tuple[tuple[int, ...], ...]:
    return tuple(dict.fromkeys((*known, *told)))
