"""The first-step check of an in-place update (``compile_optimizer``'s step): eager, compiled and a
higher-precision reference from the same start, the compiled result kept, a wrong one refused
before it is applied."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import torch

from ..errors import CompiledMismatchError
from .comparator import TensorDiff, judge, pool_small_tensors
from .compare import Sides, backend_name, compare, make_record, mismatch_message
from .first_call import copy_into, distributed_initialized, logger
from .monitor import record_first_call_check
from .reference import reference_dtype
from .trace_records import FirstCallCheck

__all__ = ["check_in_place_update"]


def check_in_place_update(
    tensors: Mapping[str, torch.Tensor],
    *,
    run_eager: Callable[[], Any],
    run_compiled: Callable[[], Any],
    recipe: str,
    backend: Any,
    updates: frozenset[str] = frozenset(),
) -> FirstCallCheck:
    """Run an in-place update eagerly, at higher precision and compiled from the same start; keep
    the compiled result.

    ``tensors`` (parameters, optimizer state) are copied; ``run_eager`` runs, the start is restored
    and ``run_compiled`` runs on the real tensors. Each tensor is judged by the comparator
    (:mod:`.comparator`); ``updates`` names tensors judged by the change they received. Where a
    tensor is not rounding-level near eager, ``run_eager`` also runs from the start with them (and
    the gradients of those named in ``updates``) swapped to float64 (float32 for 16-bit ones), the
    comparator's reference. On a failure the start is restored again before
    ``CompiledMismatchError``. Costs two copies of ``tensors`` (three, and one at the reference's
    precision, when the reference runs); returns the record (also given to running monitors).

    Example:
        >>> check_in_place_update({"w": w}, run_eager=eager_step,  # doctest: +SKIP
        ...     run_compiled=compiled_step, recipe="compile_optimizer", backend="inductor")
    """
    backend = backend_name(backend)
    if distributed_initialized():
        run_compiled()
        record = make_record(
            recipe,
            backend,
            "skipped",
            "first compiled step",
            [],
            note="torch.distributed is initialized: the check is per rank and "
            "could make ranks diverge, so it does not run",
        )
        record_first_call_check(record)
        return record
    start = time.perf_counter()
    with torch.no_grad():
        before = {name: t.detach().clone() for name, t in tensors.items()}
        run_eager()
        eager = {name: t.detach().clone() for name, t in tensors.items()}
        copy_into(tensors, before)
    check_seconds = time.perf_counter() - start
    started = time.perf_counter()
    run_compiled()
    compiled_seconds = time.perf_counter() - started
    start = time.perf_counter()
    with torch.no_grad():
        compiled = {name: t.detach() for name, t in tensors.items()}  # the result, in place

        def reference(dtype: torch.dtype) -> dict[str, torch.Tensor]:
            kept = {name: t.clone() for name, t in compiled.items()}
            copy_into(tensors, before)
            try:
                return _reference_step(tensors, updates, run_eager, dtype)
            finally:
                copy_into(tensors, kept)

        judged = lambda eager, compiled, exact, name, **_: _judge(
            before, eager, compiled, exact, name, updates
        )
        verdict = compare(
            Sides(
                eager=eager,
                compiled=compiled,
                reference=reference,
                precision=reference_dtype(tensors.values()),
                judge=judged,
                subject="the step",
            )
        )
        failures = verdict.failures
        if failures:
            copy_into(tensors, before)
    check_seconds += time.perf_counter() - start
    record = make_record(
        recipe,
        backend,
        "failed" if failures else "passed",
        "first compiled step",
        verdict.diffs,
        compared=["updates", "state"],
        check_seconds=check_seconds,
        compiled_seconds=compiled_seconds,
        reference=verdict.describe_reference(),
    )
    record_first_call_check(record)
    logger.info("%s", record.message())
    if failures:
        raise CompiledMismatchError(
            mismatch_message(record, failures, restored=True), record=record
        )
    return record


def _judge(
    before: dict[str, torch.Tensor],
    eager: dict[str, torch.Tensor],
    compiled: dict[str, torch.Tensor],
    exact: dict[str, torch.Tensor] | None,
    reference: str,
    updates: frozenset[str],
) -> list[TensorDiff]:
    diffs = []
    for name, tensor in compiled.items():
        exact_value = None if exact is None else exact[name]
        if name in updates:  # the change a step made, in float64: the parameter's own
            base = before[name].double()  # magnitude sets the rounding floor
            diffs.append(
                judge(
                    f"update.{name}",
                    eager[name].double() - base,
                    tensor.double() - base,
                    None if exact_value is None else exact_value.double() - base,
                    reference_dtype=reference,
                    floor_scale=base,
                    floor_dtype=tensor.dtype,
                )
            )
        else:
            diffs.append(judge(name, eager[name], tensor, exact_value, reference_dtype=reference))
    return pool_small_tensors(diffs)


def _reference_step(
    tensors: Mapping[str, torch.Tensor],
    updates: frozenset[str],
    run_eager: Callable[[], Any],
    dtype: torch.dtype,
) -> dict[str, torch.Tensor]:
    """The eager step with every floating tensor it reads and writes (and the gradients) in
    ``dtype``; the real tensors' data is put back."""
    floating = [t for t in tensors.values() if t.is_floating_point()]
    grads = [tensors[name].grad for name in updates if tensors[name].grad is not None]
    with _swapped([*floating, *grads], dtype):
        run_eager()
        return {name: t.detach().clone() for name, t in tensors.items()}


@contextlib.contextmanager
def _swapped(tensors: list[torch.Tensor], dtype: torch.dtype) -> Iterator[None]:
    saved: list[tuple[torch.Tensor, torch.Tensor]] = []
    seen: set[int] = set()
    try:
        for tensor in tensors:
            if id(tensor) not in seen and tensor.is_floating_point() and tensor.dtype != dtype:
                seen.add(id(tensor))
                saved.append((tensor, tensor.data))
                tensor.data = tensor.data.to(dtype)
        yield
    finally:
        for tensor, data in reversed(saved):
            tensor.data = data
