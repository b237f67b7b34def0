"""What hook guards cost a compiled PEFT model: guards and graphs (counts), and a timing hook.

``compile_peft`` compiles its regions with dynamo's module hook guards on (the fix for
``adapter_names=`` reusing a graph traced without PEFT's hooks). The guards are checked on every
call of a compiled block. :func:`measure_hook_guard_cost` compiles two copies, with and without
them, and reports guard and graph counts (load independent) and, when asked, seconds per call
(measure those on an idle machine only).
"""

from __future__ import annotations

import copy
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from .. import _dynamo
from ..regional import get_regional_plan
from .compile import compile_peft

__all__ = ["HookGuardCost", "measure_hook_guard_cost"]


@dataclass(kw_only=True, slots=True)
class HookGuardCost:
    """Guards, graphs and (optionally) call time of the compiled blocks, hook guards on and off."""

    guards_on: list[int] = field(default_factory=list)
    """Leaf guards per compiled block entry with hook guards (``compile_peft``'s default)."""
    guards_off: list[int] = field(default_factory=list)
    """The same without them (dynamo's default)."""
    graphs_on: int = 0
    """Compiled block entries after the calls, with hook guards."""
    graphs_off: int = 0
    """The same without them."""
    seconds_per_call_on: float | None = None
    """Mean seconds per forward after warm-up, with hook guards (``calls > 0`` only)."""
    seconds_per_call_off: float | None = None
    """The same without them."""


def measure_hook_guard_cost(
    model: nn.Module,
    example_inputs: Mapping[str, Any],
    *,
    backend: Any = "inductor",
    calls: int = 0,
    **compile_kwargs: Any,
) -> HookGuardCost:
    """Compile two copies of ``model`` with ``compile_peft``, hook guards on and off, and compare.

    Both copies run ``model(**example_inputs)`` without gradients once (to compile), then
    ``calls`` more times, timed. ``model`` itself is not changed. For the lead's benchmark: the
    counts are machine-independent, the seconds are not.

    Args:
        model: an uncompiled ``PeftModel`` with repeated blocks.
        example_inputs: keyword arguments of one forward.
        backend: ``torch.compile`` backend.
        calls: timed calls per copy after the first; ``0`` measures counts only.
        **compile_kwargs: further ``compile_peft`` arguments.

    Returns:
        A :class:`HookGuardCost`.

    Example:
        >>> cost = measure_hook_guard_cost(peft_model, batch, backend="eager")  # doctest: +SKIP
        >>> sum(cost.guards_on) > sum(cost.guards_off)  # doctest: +SKIP
        True
    """
    cost = HookGuardCost()
    for hook_guards in (True, False):
        copy_ = copy.deepcopy(model).eval()
        _dynamo.reset()
        compile_peft(copy_, backend=backend, hook_guards=hook_guards, on_violation="ignore", **compile_kwargs)
        with torch.no_grad():
            copy_(**example_inputs)
            start = time.perf_counter()
            for _ in range(calls):
                copy_(**example_inputs)
            seconds = (time.perf_counter() - start) / calls if calls else None
        guards = [n for code in _block_codes(copy_) for n in _dynamo.guard_counts(code)]
        if hook_guards:
            cost.guards_on, cost.graphs_on, cost.seconds_per_call_on = guards, len(guards), seconds
        else:
            cost.guards_off, cost.graphs_off, cost.seconds_per_call_off = guards, len(guards), seconds
    _dynamo.reset()
    return cost


def _block_codes(model: nn.Module) -> list[Any]:
    """The code objects dynamo compiled for the blocks: their class's ``forward``."""
    plan = get_regional_plan(model)
    if plan is None:
        return []
    classes = {type(model.get_submodule(name)) for name in plan.blocks}
    return list({cls.forward.__code__ for cls in classes if hasattr(cls.forward, "__code__")})
