"""Compiled-module detection and undo: ``module.compile()``'s private call slot.

Part of the one door to torch's private compiler APIs (see ``_dynamo/__init__.py``)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import nn

__all__ = [
    "clear_compiled_call",
    "compiled_module_names",
    "eager_call",
    "get_compiled_call",
    "is_compiled_module",
    "is_torch_compile_wrapper",
    "set_compiled_call",
    "wrap_compiled_call",
]


# --- compiled-module detection --------------------------------------------------------------
# Why: `module.compile()` stores the compiled call in the private `_compiled_call_impl`
# (`Module.compile` in torch/nn/modules/module.py, which `_call_impl` checks first); torch has no
# public "is this compiled" or "uncompile", and no upstream issue asking for one was found. Can go
# when torch offers either.


def is_torch_compile_wrapper(obj: object) -> bool:
    """Whether ``obj`` is a ``torch.compile(module)`` wrapper (``OptimizedModule``,
    ``_orig_mod``)."""
    return isinstance(obj, torch._dynamo.eval_frame.OptimizedModule)


def is_compiled_module(module: nn.Module) -> bool:
    """Whether ``module.compile()`` was called on ``module`` itself (or a helper set its call)."""
    return getattr(module, "_compiled_call_impl", None) is not None


def compiled_module_names(model: nn.Module) -> list[str]:
    """Qualified names of the modules inside ``model`` compiled in place (``""`` for ``model``)."""
    return [name for name, module in model.named_modules() if is_compiled_module(module)]


def set_compiled_call(module: nn.Module, compiled: Callable[..., Any] | None) -> None:
    """Make ``module(...)`` run ``compiled`` (what ``nn.Module.compile`` does), or undo it."""
    module._compiled_call_impl = compiled


def get_compiled_call(module: nn.Module) -> Callable[..., Any] | None:
    """What ``module(...)`` runs instead of its eager ``_call_impl``, if anything."""
    return getattr(module, "_compiled_call_impl", None)


def wrap_compiled_call(
    module: nn.Module, wrap: Callable[[Callable[..., Any]], Callable[..., Any]]
) -> bool:
    """Make ``module(...)`` run ``wrap(compiled)`` instead of its compiled call ``compiled``;
    ``False`` (nothing done) when it has none."""
    compiled = get_compiled_call(module)
    if compiled is not None:
        set_compiled_call(module, wrap(compiled))
    return compiled is not None


def clear_compiled_call(module: nn.Module) -> None:
    """Undo ``module.compile()`` (there is no public undo; see above)."""
    set_compiled_call(module, None)


def eager_call(module: nn.Module, *args: Any, **kwargs: Any) -> Any:
    """Run ``module`` through its eager call path (hooks included), skipping a compiled call."""
    return module._call_impl(*args, **kwargs)
