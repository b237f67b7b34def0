"""``no_recompiles()``: inside the block, a compiled function never recompiles.

Built on ``torch.compiler.set_stance`` (torch >= 2.6). Dynamo's "Detected recompile" error is
turned into :class:`~torchcompile_kit.UnexpectedRecompileError` naming the function and the guard
that failed, with the fix.
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Iterator
from typing import Literal

import torch

from .._checks import check_choice
from .._compat import has_set_stance
from ..errors import UnexpectedRecompileError

__all__ = ["no_recompiles"]


# torch/_dynamo/eval_frame.py raises RuntimeError("Detected recompile when torch.compile stance is
# 'fail_on_recompile'. ...") with the guard failures indented below, one per line.
_FAIL_PREFIX = "Detected recompile when torch.compile stance is 'fail_on_recompile'"
_SIZE_MISMATCH = re.compile(
    r"tensor '(?P<name>.+?)' size mismatch at index (?P<dim>\d+)\. "
    r"expected (?P<expected>\d+), actual (?P<actual>\d+)"
)
_WHERE = re.compile(r"function name: '(?P<fn>[^']*)', line number: (?P<line>\d+)")
_FILE = re.compile(r"filename: '(?P<file>[^']*)'")
# one guard failure per line: "- 0/0: L['self'].training == True  # ..."
_GUARD = re.compile(r"^\s*- (?:\d+/\d+: )?(?P<guard>.+?)\s*$", re.MULTILINE)


def _recompile_message(err: RuntimeError) -> str:
    text = str(err)
    where = _WHERE.search(text)
    file = _FILE.search(text)
    function = (
        f"{where['fn']!r} ({file['file'] if file else 'line'}:{where['line']})"
        if where
        else "a compiled function"
    )
    mismatches = [
        f"tensor {m['name']!r} has size {int(m['actual'])!r} at dim {m['dim']} "
        f"(compiled for {m['expected']})"
        for m in _SIZE_MISMATCH.finditer(text)
    ]
    fix = (
        "Warm this shape up first (warmup_shapes), pad it to a warmed-up bucket "
        "(PadToBucketCollator), or mark the dim dynamic (mark_dynamic_batch)"
    )
    if mismatches:
        what = "; ".join(dict.fromkeys(mismatches))
    elif _GUARD.search(text):
        guard = _GUARD.search(text)["guard"].split("  #")[0].strip()  # drop dynamo's source note
        what = f"guard {guard!r} failed"
        fix = "Run this variant once before the block, or keep the guarded value fixed"
    else:
        what = "it was never compiled before this block"
    return (
        f"{function} would recompile inside no_recompiles(): {what}. {fix}.\n"
        f"Dynamo said: {text}"
    )


@contextlib.contextmanager
def no_recompiles(*, on_recompile: Literal["error", "eager"] = "error") -> Iterator[None]:
    """Inside this block, a compiled function never recompiles (nor compiles for the first time).

    Built on ``torch.compiler.set_stance``; the previous stance is restored on exit. Graphs
    compiled before the block (e.g. by :func:`warmup_shapes`) still run. Dynamo's error is turned
    into :class:`~torchcompile_kit.UnexpectedRecompileError` as it leaves the block, so catch it
    around the ``with``, not inside it.

    Args:
        on_recompile: ``"error"`` (``"fail_on_recompile"``): raise
            :class:`~torchcompile_kit.UnexpectedRecompileError` naming the tensor and size that
            missed; for tests and first runs. ``"eager"`` (``"eager_on_recompile"``): run that call
            eagerly instead, for production runs that must not stall on a compile.

    Yields:
        Nothing.

    Raises:
        UnexpectedRecompileError: with ``on_recompile="error"``, a call needed a new graph.
        ValueError: ``on_recompile`` is neither ``"error"`` nor ``"eager"``.
        RuntimeError: this torch has no ``torch.compiler.set_stance`` (torch < 2.6).

    Example:
        >>> step = torch.compile(lambda x: x * 2, backend="eager", dynamic=False)
        >>> _ = step(torch.ones(4))
        >>> with no_recompiles():
        ...     _ = step(torch.ones(4))  # warmed up: runs; step(torch.ones(5)) would raise
    """
    stances = {"error": "fail_on_recompile", "eager": "eager_on_recompile"}
    check_choice("on_recompile", on_recompile, tuple(stances), hint="'error' raises, 'eager' runs the call eagerly")
    if not has_set_stance():
        raise RuntimeError(
            f"no_recompiles() needs torch.compiler.set_stance (torch >= 2.6); this is torch "
            f"{torch.__version__!r}: upgrade torch"
        )
    with torch.compiler.set_stance(stances[on_recompile]):
        try:
            yield
        except RuntimeError as err:
            if isinstance(err, UnexpectedRecompileError) or not str(err).startswith(_FAIL_PREFIX):
                raise
            raise UnexpectedRecompileError(_recompile_message(err)) from err
