"""Dynamic dims and warm-up: shapes decided before training, not during it — one dynamic graph
(:func:`mark_dynamic_batch`) or one static graph per bucket compiled up front
(:func:`warmup_shapes`).
"""

from __future__ import annotations

import inspect
import logging
import sys
import warnings
from collections.abc import Callable, Collection, Iterable, Iterator, Mapping
from typing import Any

import torch

from .. import _dynamo
from .._checks import parameters_of
from ..errors import BatchShapeError

__all__ = ["mark_dynamic_batch", "warmup_shapes"]

logger = logging.getLogger(__name__)


def _tensors(batch: Any, path: str = "batch") -> Iterator[tuple[str, torch.Tensor]]:
    """``(path, tensor)`` for every tensor in a tensor / mapping / list / tuple batch."""
    if isinstance(batch, torch.Tensor):
        yield path, batch
    elif isinstance(batch, Mapping):
        for key, value in batch.items():
            yield from _tensors(value, f"{path}[{key!r}]")
    elif isinstance(batch, (list, tuple)):
        for index, value in enumerate(batch):
            yield from _tensors(value, f"{path}[{index}]")


def mark_dynamic_batch(
    batch: Any,
    dims: int | Collection[int] = 1,
    *,
    min: int | None = None,
    max: int | None = None,
    keys: Collection[str] | None = None,
) -> Any:
    """Mark dim(s) ``dims`` dynamic on every tensor of ``batch``, so new lengths reuse one graph.

    Every tensor is marked (``labels`` and ``attention_mask`` carry the length too, and the first
    unmarked one to change recompiles). Mark the batch you compile with; later batches match the
    dynamic graph unmarked. Dims of size 0 or 1 are left unmarked with a warning (dynamo always
    specializes them), and ``min``/``max`` are checked here rather than failing inside the compiler
    (docs/shapes.md, "mark_dynamic_batch").

    Args:
        batch: a tensor, or a mapping/list/tuple (nested) of tensors; non-tensors are ignored.
        dims: the dim (or dims) to mark; tensors with too few dims are skipped.
        min: smallest size the graph must accept (``>= 2``); ``None`` for no bound.
        max: largest size the graph must accept; ``None`` for no bound.
        keys: for a mapping batch, only these top-level keys (default: all), e.g. to leave out
            ``pixel_values``.

    Returns:
        ``batch`` itself (marked in place), for chaining.

    Raises:
        ValueError: ``min < 2``, ``min > max``, a marked size outside ``[min, max]``, a key in
            ``keys`` missing from the batch, ``keys`` given for a batch that is not a mapping, a
            batch with no tensor, or ``dims`` that no tensor of the batch has.

    Example:
        >>> batch = {"input_ids": torch.ones(4, 16, dtype=torch.long), "labels": torch.ones(4, 16)}
        >>> batch = mark_dynamic_batch(batch,  # doctest: +NORMALIZE_WHITESPACE
        ...     1)  # one graph for every length >= 2
    """
    dim_list = list(dims) if isinstance(dims, Collection) else [dims]
    if not dim_list or any(isinstance(dim, bool) or not isinstance(dim, int) for dim in dim_list):
        raise BatchShapeError(
            f"dims={dims!r} must be a dim (int) or a collection of them, e.g. "
            "dims=1 for the sequence length of (batch, length) tensors"
        )
    if min is not None and min < 2:
        raise BatchShapeError(
            f"min={min!r}: dynamo assumes dynamic sizes are >= 2 (0 and 1 are "
            "always specialized), so the bound cannot hold; pass min=None or "
            "min>=2, and keep size-1 batches out (drop_last=True)"
        )
    if min is not None and max is not None and min > max:
        raise BatchShapeError(f"min={min!r} is larger than max={max!r}; swap them")
    if keys is not None:
        if not isinstance(batch, Mapping):
            raise BatchShapeError(
                f"keys={sorted(keys)!r} needs a mapping batch, got {type(batch).__name__!r}"
            )
        missing = sorted(set(keys) - set(batch))
        if missing:
            raise BatchShapeError(
                f"keys {missing!r} are not in the batch (its keys: {sorted(batch)!r})"
            )
        batch_view: Any = {key: batch[key] for key in batch if key in keys}
    else:
        batch_view = batch
    specialized = []
    tensors = list(_tensors(batch_view))
    if not tensors:
        raise BatchShapeError(
            f"batch holds no tensor to mark (got {type(batch).__name__}: "
            f"{batch!r:.60}); pass the batch itself: a tensor, or a mapping, list "
            "or tuple of tensors"
        )
    if not any(-tensor.dim() <= dim < tensor.dim() for _, tensor in tensors for dim in dim_list):
        shapes = ", ".join(f"{path} {tuple(tensor.shape)}" for path, tensor in tensors[:4])
        raise BatchShapeError(
            f"dims={dims!r}: no tensor of the batch has that dim ({shapes}); "
            "pass a dim the tensors have, e.g. dims=1 for (batch, length)"
        )
    for path, tensor in tensors:
        for dim in dim_list:
            if not -tensor.dim() <= dim < tensor.dim():
                continue
            size = tensor.shape[dim]
            if size < 2:
                specialized.append(f"{path} (size {size} at dim {dim})")
                continue
            if (min is not None and size < min) or (max is not None and size > max):
                raise BatchShapeError(
                    f"{path} has size {size!r} at dim {dim}, outside "
                    f"[min={min!r}, max={max!r}]; dynamo treats the range as a "
                    "hard limit, so widen min/max (or pass None)"
                )
            # torch builds ValueRanges(lower=min, upper=max) and asserts on a None bound ("not
            # simple sympy type None") when only one is given: the other takes dynamo's own
            # assumption for a dynamic size (2 .. unbounded).
            _dynamo.mark_dynamic(
                tensor,
                dim % tensor.dim(),
                min=None if min is None and max is None else (2 if min is None else min),
                max=max if max is not None or min is None else sys.maxsize,
            )
    if specialized:
        warnings.warn(
            f"mark_dynamic_batch left {', '.join(specialized)} unmarked: dynamo always "
            "specializes sizes 0 and 1, so this shape compiles its own graph (a "
            "recompile). Use drop_last=True, or pad that dim to >= 2.",
            stacklevel=2,
        )
    return batch


def _signature(batch: Any) -> tuple[tuple[str, tuple[int, ...], torch.dtype], ...]:
    return tuple((path, tuple(t.shape), t.dtype) for path, t in _tensors(batch))


def warmup_shapes(
    fn: Callable[[Any], Any],
    batches: Iterable[Any],
    *,
    model: torch.nn.Module | torch.optim.Optimizer | Iterable[torch.Tensor] | None = None,
) -> list[dict[str, tuple[int, ...]]]:
    """Call ``fn`` once per distinct batch shape so every graph is compiled before training.

    Batches with the shapes and dtypes of an earlier batch are skipped. Warm up the step you will
    run (train/eval and grad mode are guarded too). Every parameter's ``.grad`` is put back as it
    was, so the first optimizer step sees only its own batch's gradients; the parameters are
    ``model``'s, or those of the modules ``fn`` reaches (its ``self``, globals and closure
    variables, through ``torch.compile`` wrappers). Warns when dynamo hit a recompile limit
    meanwhile.

    Args:
        fn: the compiled callable, called as ``fn(batch)``; it must not update weights.
        batches: candidate batches, e.g.
            ``(collate([ds[i] for i in idx]) for idx in sampler.warmup_indices())``.
        model: the module (or optimizer, or parameters) whose gradients ``fn`` accumulates.

    Returns:
        One ``{tensor path: shape}`` dict per shape that ``fn`` ran on, in order.

    Example:
        >>> step = torch.compile(lambda b: b["x"].sum(), backend="eager", dynamic=False)
        >>> warmup_shapes(step, [{"x": torch.ones(2, 8)}, {  # doctest: +NORMALIZE_WHITESPACE
        ...     "x": torch.ones(2, 8)}])
        [{"batch['x']": (2, 8)}]
    """
    if not callable(fn):
        raise TypeError(
            f"warmup_shapes: fn={fn!r:.80} is not callable; pass the compiled step, "
            "called as fn(batch)"
        )
    if isinstance(batches, (Mapping, torch.Tensor)):  # iterating it would call fn on keys or rows
        raise TypeError(
            f"warmup_shapes: batches is one batch (a {type(batches).__name__}), not an "
            "iterable of batches; pass [batch] for a single one, or a list or generator"
        )
    if isinstance(batches, (str, bytes)) or not hasattr(batches, "__iter__"):
        raise TypeError(
            f"warmup_shapes: batches={batches!r:.80} is not an iterable of batches; pass "
            "a list or generator of batches, e.g. [batch] for a single one"
        )
    params = _parameters_of([model] if model is not None else _modules_reached(fn))
    saved = [(p, None if p.grad is None else p.grad.detach().clone()) for p in params]
    hits_before = _dynamo.recompile_limit_hits()
    seen: set[tuple[tuple[str, tuple[int, ...], torch.dtype], ...]] = set()
    shapes: list[dict[str, tuple[int, ...]]] = []
    try:
        for batch in batches:
            signature = _signature(batch)
            if signature in seen:
                continue
            seen.add(signature)
            _log_progress(len(shapes) + 1, signature)
            fn(batch)
            shapes.append({path: shape for path, shape, _ in signature})
    finally:
        _restore_grads(saved)
    hits = _dynamo.recompile_limit_hits() - hits_before
    if hits:
        warnings.warn(
            f"warmup_shapes: dynamo hit a recompile limit {hits} time(s) while warming "
            f"up {len(shapes)} distinct shapes (torch._dynamo.config.recompile_limit is "
            f"{_dynamo.recompile_limit()}): a frame of those shapes was not compiled "
            "and runs eagerly. Use fewer buckets (or drop_last=True); with "
            "compile_regional, tell the model its shapes first: expect_shapes(model, "
            "sampler) sizes the limit of its blocks (and mode='eval' for evaluation); "
            f"with torch.compile, pass recompile_limit={len(shapes)} (torch >= 2.13)",
            stacklevel=2,
        )
    return shapes


def _log_progress(index: int, signature: tuple[tuple[str, tuple[int, ...], Any], ...]) -> None:
    shapes = ", ".join(f"{path} {tuple(shape)}" for path, shape, _ in signature[:2])
    logger.info("warmup_shapes: shape %d (%s): compiling ...", index, shapes)


def _modules_reached(fn: Any, depth: int = 2) -> list[torch.nn.Module]:
    """Modules ``fn`` is, is bound to, or names as a global or closure variable (``depth`` deep)."""
    found: dict[int, torch.nn.Module] = {}
    seen: set[int] = set()
    todo = [fn]
    for _ in range(depth + 1):
        following = []
        for obj in todo:
            if id(obj) in seen:
                continue
            seen.add(id(obj))
            if isinstance(obj, torch.nn.Module):
                found[id(obj)] = obj
                continue
            bound = getattr(obj, "__self__", None)
            if isinstance(bound, torch.nn.Module):
                found[id(bound)] = bound
            following += [getattr(obj, "__wrapped__", None), getattr(obj, "__func__", None)]
            if not inspect.isfunction(obj):
                continue
            names = inspect.getclosurevars(obj)
            following += [
                v
                for v in (*names.nonlocals.values(), *names.globals.values())
                if isinstance(v, torch.nn.Module) or inspect.isfunction(v)
            ]
        todo = [obj for obj in following if obj is not None]
    return list(found.values())


def _parameters_of(sources: Iterable[Any]) -> list[torch.Tensor]:
    params: dict[int, torch.Tensor] = {}
    for source in sources:
        params.update((id(p), p) for p in parameters_of(source, what="warmup_shapes: model="))
    return list(params.values())


def _restore_grads(saved: list[tuple[torch.Tensor, torch.Tensor | None]]) -> None:
    for param, grad in saved:
        if grad is None:
            param.grad = None
        elif param.grad is not None and param.grad.shape == grad.shape:
            param.grad.copy_(grad)  # keeps the storage (static grads, CUDA graphs)
        else:
            param.grad = grad
