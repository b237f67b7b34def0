"""The first-step check of an in-place update (``compile_optimizer``'s step): eager and compiled
from the same start, the compiled result kept, a mismatch refused before it is applied."""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from typing import Any

import torch

from ..errors import CompiledMismatchError
from .equivalence import _backend_name
from .first_call import copy_into, distributed_initialized, logger, make_record, mismatch_message
from .monitor import record_first_call_check
from .tensor_diff import TensorDiff, compare_trees
from .trace_records import FirstCallCheck

__all__ = ["check_in_place_update"]


def check_in_place_update(tensors: Mapping[str, torch.Tensor], *, run_eager: Callable[[], Any],
                          run_compiled: Callable[[], Any], recipe: str, backend: Any,
                          updates: frozenset[str] = frozenset()) -> FirstCallCheck:
    """Run an in-place update eagerly and compiled from the same start; keep the compiled result.

    ``tensors`` (parameters, optimizer state) are copied, ``run_eager`` runs, the start is restored
    and ``run_compiled`` runs on the real tensors. On a mismatch the start is restored again before
    ``CompiledMismatchError``. ``updates`` names tensors compared by the change they received. Costs
    two copies of ``tensors`` while it runs; returns the record (also given to running monitors).

    Example:
        >>> check_in_place_update({"w": w}, run_eager=eager_step, run_compiled=compiled_step,
        ...                       recipe="compile_optimizer", backend="inductor")  # doctest: +SKIP
    """
    backend_name = _backend_name(backend)
    if distributed_initialized():
        run_compiled()
        record = make_record(recipe, backend_name, "skipped", "first compiled step", [],
                              note="torch.distributed is initialized: the check is per rank and "
                              "could make ranks diverge, so it does not run")
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
    diffs: list[TensorDiff] = []
    with torch.no_grad():
        for name, tensor in tensors.items():
            if name in updates:
                diffs += compare_trees(f"update.{name}", eager[name] - before[name],
                                       tensor.detach() - before[name], (None, None))
            else:
                diffs += compare_trees(name, eager[name], tensor.detach(), (None, None))
        failures = [d for d in diffs if not d.ok]
        if failures:
            copy_into(tensors, before)
    check_seconds += time.perf_counter() - start
    record = make_record(recipe, backend_name, "failed" if failures else "passed",
                          "first compiled step", diffs, compared=["updates", "state"],
                          check_seconds=check_seconds, compiled_seconds=compiled_seconds)
    record_first_call_check(record)
    logger.info("%s", record.message())
    if failures:
        raise CompiledMismatchError(mismatch_message(record, failures, restored=True), record=record)
    return record
