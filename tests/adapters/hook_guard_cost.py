"""What compile_peft's hook guards cost, in guards (load independent): a measurement for
docs/peft.md and its test, not part of the library."""

from __future__ import annotations

import copy
from typing import Any

import torch
from torch import nn

from torchcompile_kit import compile_peft
from torchcompile_kit.regional import get_regional_plan


def guard_counts(code: Any) -> list[int]:
    """Leaf guards of each compiled entry dynamo holds for ``code`` (a function's ``__code__``);
    torch's ``_debug_get_cache_entry_list`` and guard managers have no public twin."""
    from torch._dynamo.eval_frame import _debug_get_cache_entry_list

    def count(manager: Any) -> int:
        return len(manager.get_leaf_guards()) + sum(count(c) for c in manager.get_child_managers())

    return [count(entry.guard_manager.root) for entry in _debug_get_cache_entry_list(code)]


def block_guard_counts(model: nn.Module, inputs: dict[str, Any], *, hook_guards: bool,
                       backend: Any = "eager") -> list[int]:
    """Compile a copy of ``model`` with ``compile_peft``, run one forward without gradients, and
    return the leaf guards of each compiled entry of its blocks' ``forward``."""
    compiled = copy.deepcopy(model).eval()
    torch._dynamo.reset()
    compile_peft(compiled, backend=backend, hook_guards=hook_guards, on_violation="ignore")
    with torch.no_grad():
        compiled(**inputs)
    plan = get_regional_plan(compiled)
    classes = {type(compiled.get_submodule(name)) for name in plan.blocks}
    counts = [n for cls in classes for n in guard_counts(cls.forward.__code__)]
    torch._dynamo.reset()
    return counts
