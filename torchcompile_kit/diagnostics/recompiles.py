"""``no_recompiles()``: inside the block, a compiled function never recompiles.

Built on ``torch.compiler.set_stance``; dynamo's error becomes
:class:`~torchcompile_kit.errors.UnexpectedRecompileError` naming what would recompile, the input,
the failed guard and the fix.
"""

from __future__ import annotations

import contextlib
import contextvars
import inspect
import os
import re
import traceback
from collections.abc import Iterator
from types import TracebackType
from typing import Any, Literal

import torch

from .._checks import check_choice
from ..errors import UnexpectedRecompileError

__all__ = ["allow_first_compile", "no_recompiles"]

# The stance no_recompiles() set, or None outside every no_recompiles() block.
_ACTIVE_STANCE: contextvars.ContextVar[str | None] = contextvars.ContextVar(
    "torchcompile_kit_no_recompiles", default=None
)

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
# How dynamo names a call's inputs: args[0] / L['args'][0], kwargs['input_ids'] /
# L['kwargs']['input_ids'], L['x']; what follows (['input_ids'], .grad) is kept as written.
_POSITIONAL = re.compile(r"^(?:L\[')?args(?:'\])?\[(?P<index>\d+)\](?P<rest>.*)$")
_KEYWORD = re.compile(r"""^(?:L\[')?kwargs(?:'\])?\[['"](?P<name>\w+)['"]\](?P<rest>.*)$""")
_LOCAL = re.compile(r"""^L\[['"](?P<name>\w+)['"]\](?P<rest>.*)$""")

_TORCH_OPTIM = os.path.join("torch", "optim", "")  # torch.optim's files (compiled optimizer steps)

_SHAPE_FIX = (
    "Warm this shape up first (warmup_shapes), pad it to a warmed-up bucket "
    "(PadToBucketCollator), or mark the dim dynamic (mark_dynamic_batch)"
)
_FIRST_COMPILE_FIX = "Call it once before the block (warmup_shapes runs one call per batch shape)"
_GUARD_FIX = "Run this variant once before the block, or keep the guarded value fixed"
_OPTIMIZER_FIRST_FIX = (
    "A compiled optimizer step compiles at its first call and again once the "
    "optimizer has state (its second step). compile_optimizer(optimizer) runs "
    "the first step eagerly and may compile at the second inside "
    "no_recompiles(); if you compiled optimizer.step yourself, run two "
    "optimizer steps before the block, or use compile_optimizer"
)
_OPTIMIZER_GUARD_FIX = (
    "An optimizer step recompiles when a float hyperparameter changes "
    "(compile_optimizer holds lr and Adam's betas as tensors; SGD's momentum, "
    "eps and weight_decay stay floats), when a parameter gains or loses its "
    "gradient (a layer frozen or unfrozen), or when a param group is added. "
    "Make such a change before the block and run one optimizer step after it, "
    "or compile the optimizer with compile_optimizer"
)


def _frame_owner(
    tb: TracebackType | None, file: str | None, function: str | None, line: int | None
) -> Any:
    """The optimizer or module whose compiled code dynamo refused, innermost first, found as
    ``self`` of the calling frames (dynamo names only a code object, often a shared wrapper): the
    installed step or ``Optimizer.step``, or ``nn.Module.__call__`` matched by its ``forward``'s
    code.
    """
    for frame, _ in reversed(list(traceback.walk_tb(tb))):
        owner = frame.f_locals.get("self")
        if isinstance(owner, torch.optim.Optimizer):
            return owner
        if isinstance(owner, torch.nn.Module) and function is not None:
            for forward in (type(owner).forward, getattr(owner, "forward", None)):
                code = getattr(getattr(forward, "__func__", forward), "__code__", None)
                if code is not None and (code.co_name, code.co_firstlineno, code.co_filename) == (
                    function,
                    line,
                    file,
                ):
                    return owner
    return None


def _positional_names(module: torch.nn.Module) -> list[str]:
    """The names of ``module.forward``'s positional parameters (through ``functools.wraps``)."""
    try:
        params = inspect.signature(type(module).forward).parameters.values()
    except (TypeError, ValueError):
        return []
    positional = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    return [p.name for p in params if p.kind in positional][1:]  # drop self


def _input_name(source: str, module: torch.nn.Module | None) -> str:
    """``'hidden_states' (args[0])`` for dynamo's ``args[0]``; ``'input_ids'`` for its kwargs."""
    keyword = _KEYWORD.match(source) or _LOCAL.match(source)
    if keyword:
        return repr(keyword["name"] + keyword["rest"])
    positional = _POSITIONAL.match(source)
    if positional and module is not None:
        names = _positional_names(module)
        index = int(positional["index"])
        if index < len(names):
            return f"{names[index] + positional['rest']!r} ({source})"
    return repr(source)


def _describe(owner: Any, file: str | None, function: str | None, line: str | None) -> str:
    if isinstance(owner, torch.optim.Optimizer):
        where = f" ({function!r}, {file}:{line})" if function else ""
        return f"the {type(owner).__name__} optimizer's step{where}"
    if isinstance(owner, torch.nn.Module):
        forward = inspect.unwrap(type(owner).forward)
        code = getattr(forward, "__code__", None)
        where = f"{code.co_filename}:{code.co_firstlineno}" if code else f"{file}:{line}"
        return f"{type(owner).__name__}.forward ({where})"
    if function is None:
        return "a compiled function"
    if file and _TORCH_OPTIM in file:
        return f"an optimizer step ({function!r}, {file}:{line})"
    return f"{function!r} ({file or 'line'}:{line})"


def _recompile_message(err: RuntimeError) -> str:
    text = str(err)
    where = _WHERE.search(text)
    file_match = _FILE.search(text)
    file = file_match["file"] if file_match else None
    function, line = (where["fn"], where["line"]) if where else (None, None)
    owner = _frame_owner(err.__traceback__, file, function, int(line) if line else None)
    subject = _describe(owner, file, function, line)
    is_optimizer = isinstance(owner, torch.optim.Optimizer) or bool(file and _TORCH_OPTIM in file)
    module = owner if isinstance(owner, torch.nn.Module) else None
    mismatches = [
        f"input {_input_name(m['name'], module)} has size {int(m['actual'])!r} at dim "
        f"{m['dim']} (compiled for {m['expected']})"
        for m in _SIZE_MISMATCH.finditer(text)
    ]
    guard_match = _GUARD.search(text)
    if mismatches:
        what = "; ".join(dict.fromkeys(mismatches))
        fix = _OPTIMIZER_GUARD_FIX if is_optimizer else _SHAPE_FIX
    elif guard_match:
        guard = guard_match["guard"].split("  #")[0].strip()  # drop dynamo's source note
        what = f"guard {guard!r} failed"
        fix = _OPTIMIZER_GUARD_FIX if is_optimizer else _GUARD_FIX
    else:
        what = "it was never compiled before this block"
        fix = _OPTIMIZER_FIRST_FIX if is_optimizer else _FIRST_COMPILE_FIX
    return f"{subject} would recompile inside no_recompiles(): {what}. {fix}.\nDynamo said: {text}"


@contextlib.contextmanager
def no_recompiles(*, on_recompile: Literal["error", "eager"] = "error") -> Iterator[None]:
    """Inside this block, a compiled function never recompiles (nor compiles for the first time).

    Built on ``torch.compiler.set_stance`` (the previous stance is restored on exit); graphs
    compiled before the block still run. The error is raised as it leaves the block, so catch it
    around the ``with``, and names what would recompile (``LlamaDecoderLayer.forward`` and its input
    ``'hidden_states' (args[0])``, or the optimizer). One exception by design:
    :func:`~torchcompile_kit.compile_optimizer`'s step may compile its *first* graph inside the
    block (its first step runs eagerly to create the state; :func:`allow_first_compile`).

    Args:
        on_recompile: ``"error"``: raise :class:`~torchcompile_kit.errors.UnexpectedRecompileError`
            (tests, first runs); ``"eager"``: run that call eagerly (runs that must not stall).

    Raises:
        UnexpectedRecompileError: with ``on_recompile="error"``, a call needed a new graph.
        ValueError: ``on_recompile`` is neither ``"error"`` nor ``"eager"``.

    Example:
        >>> step = torch.compile(lambda x: x * 2, backend="eager", dynamic=False)
        >>> _ = step(torch.ones(4))
        >>> with no_recompiles():
        ...     _ = step(torch.ones(  # doctest: +NORMALIZE_WHITESPACE
        ...     4))  # warmed up: runs; step(torch.ones(5)) would raise
    """
    stances = {"error": "fail_on_recompile", "eager": "eager_on_recompile"}
    check_choice(
        "on_recompile",
        on_recompile,
        tuple(stances),
        hint="'error' raises, 'eager' runs the call eagerly",
    )
    token = _ACTIVE_STANCE.set(stances[on_recompile])
    try:
        with torch.compiler.set_stance(stances[on_recompile]):
            try:
                yield
            except RuntimeError as err:
                if isinstance(err, UnexpectedRecompileError) or not str(err).startswith(
                    _FAIL_PREFIX
                ):
                    raise
                raise UnexpectedRecompileError(_recompile_message(err)) from err
    finally:
        _ACTIVE_STANCE.reset(token)


@contextlib.contextmanager
def allow_first_compile() -> Iterator[bool]:
    """Let the call inside compile its *first* graph even within :func:`no_recompiles`.

    For a compiled callable whose first graph cannot exist before training starts
    (``compile_optimizer``'s step compiles at the second step); later calls run under the block's
    stance. Yields whether the stance was lifted (only inside ``no_recompiles()``).

    Example:
        >>> step = torch.compile(lambda x: x + 1, backend="eager")
        >>> with no_recompiles(), allow_first_compile():
        ...     _ = step(torch.ones(2))  # compiles: its first graph
    """
    if _ACTIVE_STANCE.get() is None or torch.compiler.is_compiling():
        yield False
        return
    with torch.compiler.set_stance("default"):
        yield True
