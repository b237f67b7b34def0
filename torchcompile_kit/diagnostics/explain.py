"""``explain_graph_breaks``: the graph breaks of a function or module on sample inputs, compiled
afresh in an isolated cache region (unlike ``torch._dynamo.explain``, it resets nothing).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from contextvars import ContextVar
from typing import Any

import torch
from torch import nn

from .. import _dynamo
from .monitor import CompileMonitor
from .trace_records import GraphBreak

__all__ = ["explain_graph_breaks", "explaining"]

_EXPLAINING: ContextVar[bool] = ContextVar("torchcompile_kit_explaining", default=False)


def explaining() -> bool:
    """Whether ``explain_graph_breaks`` is tracing now (its whole-model trace of a regionally
    compiled model is not the outer compile the regional recipe warns about).

    Example:
        >>> explaining()
        False
    """
    return _EXPLAINING.get()


def explain_graph_breaks(fn_or_module: Any, *args: Any, **kwargs: Any) -> list[GraphBreak]:
    """Run ``fn_or_module(*args, **kwargs)`` once, compiled, and return its graph breaks.

    Each break has the reason in plain words, the user-code ``file:line``, torch's graph-break code
    where it gives one, its hints, the function it happened in and, for a module, the class and
    the paths of the submodules whose code it is in. The call really runs (side effects
    included); a module runs through its eager path, and modules compiled in place inside it
    (``compile_regional``'s blocks) run their eager code for the call, so their code is traced as
    part of it: every break is listed, also where the blocks were compiled with
    ``fullgraph=True`` (which would raise at the first one). Returns the distinct breaks in the
    order met (``[]``: one graph); ``TypeError`` when ``fn_or_module`` is not callable.

    Example:
        >>> def f(x):
        ...     print("step")
        ...     return x + 1
        >>> [b.reason.split(":")[0] for b in explain_graph_breaks(f, torch.ones(2))]
        step
        ['Failed to trace builtin operator']
    """
    if not callable(fn_or_module):
        raise TypeError(
            f"explain_graph_breaks expects a function or nn.Module, got "
            f"{type(fn_or_module).__name__!r}; pass the model or function itself"
        )
    target = fn_or_module
    if isinstance(fn_or_module, nn.Module):
        module = fn_or_module

        def target(*a: Any, **k: Any) -> Any:  # an eager call, even for a module compiled in place
            return _dynamo.eager_call(module, *a, **k)

    isolated = _dynamo.isolated_cache_kwarg()
    # A backend object of our own: a cached graph of the caller's (another backend) never matches,
    # so the code is really traced and every break is seen again.
    compiled = torch.compile(target, backend=_dynamo.frame_counting_backend(), **isolated)
    with CompileMonitor() as monitor, _eager_code(fn_or_module):
        compiled(*args, **kwargs)
    breaks = list(monitor.graph_breaks)
    if isinstance(fn_or_module, nn.Module):
        monitor.attribute(fn_or_module)
        paths: dict[str, list[str]] = {}
        for name, sub in fn_or_module.named_modules():
            paths.setdefault(type(sub).__name__, []).append(name or "<model>")
        for found in breaks:
            found.modules = paths.get(found.owner or "", [])
    if not isolated:
        for found in breaks:
            found.hints.append(
                "explain_graph_breaks: this torch has no isolate_recompiles, so "
                "the traced frames used one entry of their recompile budget"
            )
    return breaks


@contextlib.contextmanager
def _eager_code(target: Any) -> Iterator[None]:
    """The modules compiled in place inside ``target`` run their eager code while the block runs
    (put back after), and :func:`explaining` is true."""
    members = target.modules() if isinstance(target, nn.Module) else ()
    saved = [(m, call) for m in members if (call := _dynamo.get_compiled_call(m)) is not None]
    token = _EXPLAINING.set(True)
    try:
        for module, _ in saved:
            _dynamo.clear_compiled_call(module)
        yield
    finally:
        _EXPLAINING.reset(token)
        for module, call in saved:
            _dynamo.set_compiled_call(module, call)
