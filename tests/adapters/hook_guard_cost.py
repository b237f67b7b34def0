"""What compile_peft's hook guards cost, in guards (load independent): a measurement for
docs/peft.md and its test, not part of the library."""

from __future__ import annotations

import contextlib
import copy
from collections.abc import Iterator
from typing import Any
from unittest import mock

import torch
from torch import nn

from torchcompile_kit import _dynamo, compile_peft
from torchcompile_kit.regional import get_regional_plan


def guard_counts(code: Any) -> list[int]:
    """Leaf guards of each compiled entry dynamo holds for ``code`` (a function's ``__code__``);
    torch's ``_debug_get_cache_entry_list`` and guard managers have no public twin."""
    from torch._dynamo.eval_frame import _debug_get_cache_entry_list

    def count(manager: Any) -> int:
        return len(manager.get_leaf_guards()) + sum(count(c) for c in manager.get_child_managers())

    return [count(entry.guard_manager.root) for entry in _debug_get_cache_entry_list(code)]


def block_guard_counts(
    model: nn.Module, inputs: dict[str, Any], *, hook_guards: bool, backend: Any = "eager"
) -> list[int]:
    """Compile a copy of ``model`` with ``compile_peft``, run one forward without gradients, and
    return the leaf guards of each compiled entry of its blocks' ``forward``."""
    compiled = copy.deepcopy(model).eval()
    torch._dynamo.reset()
    with contextlib.nullcontext() if hook_guards else hook_guards_off():
        compile_peft(compiled, backend=backend, on_violation="ignore")
    with torch.no_grad():
        compiled(**inputs)
    plan = get_regional_plan(compiled)
    classes = {type(compiled.get_submodule(name)) for name in plan.blocks}
    counts = [n for cls in classes for n in guard_counts(cls.forward.__code__)]
    torch._dynamo.reset()
    return counts


@contextlib.contextmanager
def hook_guards_off() -> Iterator[None]:
    """``compile_peft`` as dynamo's default would have it: its compiled regions without the module
    hook guards (``_dynamo.with_module_hook_guards`` made a no-op while the model is compiled)."""
    with mock.patch.object(_dynamo, "with_module_hook_guards", lambda call: call):
        yield
