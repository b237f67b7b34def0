"""The only door to torch's private compiler APIs.

Everything in torchcompile_kit that touches a private name of torch's compiler stack
(``torch._dynamo``, ``torch._inductor``, ``torch._higher_order_ops``, ``torch._logging``,
``torch._C``, ``nn.Module._compiled_call_impl``) goes through a function here, so a torch release
that moves one of them breaks one module, not twelve. Each use says why it is needed, where
upstream it comes from, and when it can go. ``tests/test_layout.py`` fails if any other module of
the package names one of these.

Nothing here runs at import time beyond importing torch: every lookup happens when called, so a
missing name is a clear error (or a documented fallback) at the point of use.
"""

from __future__ import annotations

import contextlib
import functools
import os
import tempfile
from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch import nn

__all__ = [
    "clear_compiled_call",
    "compiled_module_names",
    "eager_call",
    "foreach_map_op",
    "frame_counting_backend",
    "fresh_inductor_cache",
    "get_compiled_call",
    "inductor_freezing_enabled",
    "is_compiled_module",
    "isolated_cache_kwarg",
    "is_torch_compile_wrapper",
    "mark_dynamic",
    "mark_static_address",
    "privateuse1_backend_name",
    "recompile_limit",
    "recompile_limit_hits",
    "recompile_limit_kwarg",
    "reset",
    "set_compiled_call",
]


# --- the recompile limit --------------------------------------------------------------------
# Why: a block class, a shape or an adapter state gets `recompile_limit` graphs per code object;
# past it dynamo runs the frame eagerly and says so once. Helpers size their work against it.
# Upstream: renamed from `cache_size_limit` to `recompile_limit` in pytorch#143288 (torch 2.6/2.7);
# older releases only have `cache_size_limit`. Can go when torch>=2.7 is the floor.
_LIMIT_NAMES = ("recompile_limit", "cache_size_limit")


def _limit_name(config: Any = None) -> str:
    config = torch._dynamo.config if config is None else config
    for name in _LIMIT_NAMES:
        if hasattr(config, name):
            return name
    raise RuntimeError(
        f"torch {torch.__version__} has neither torch._dynamo.config.recompile_limit nor "
        "cache_size_limit; torchcompile_kit supports torch >= 2.6."
    )


def recompile_limit(config: Any = None) -> int:
    """Dynamo's per-code-object recompile limit (8 by default), under its name for this torch.

    Args:
        config: a stand-in for ``torch._dynamo.config`` (tests switch the probe with it).
    """
    config = torch._dynamo.config if config is None else config
    return int(getattr(config, _limit_name(config)))


def recompile_limit_kwarg() -> str | None:
    """The ``torch.compile`` keyword that sets the limit for one compile call, or ``None``.

    Why: raising the limit for one block group must not raise it globally. Upstream:
    ``torch.compile(..., recompile_limit=)`` is not in every release; where it is missing the
    caller warns instead. Can go when every supported torch has it.
    """
    import inspect

    params = inspect.signature(torch.compile).parameters
    return "recompile_limit" if "recompile_limit" in params else None


def isolated_cache_kwarg() -> dict[str, bool]:
    """``{"isolate_recompiles": True}`` where ``torch.compile`` takes it, else ``{}``.

    Why: a frame of ours shared by several compiled regions (torch.nn modules, which dynamo will
    not trace as a top-level frame) must not share one recompile budget across them. Upstream:
    ``torch.compile(isolate_recompiles=)`` is recent; without it the regions share the budget and
    may recompile up to the limit. Can go when every supported torch has it.
    """
    import inspect

    params = inspect.signature(torch.compile).parameters
    return {"isolate_recompiles": True} if "isolate_recompiles" in params else {}


# --- compiled-module detection --------------------------------------------------------------
# Why: `module.compile()` stores the compiled call in the private `_compiled_call_impl`
# (torch/nn/modules/module.py); there is no public "is this compiled" or "uncompile". Upstream:
# https://github.com/pytorch/pytorch/issues/125683 (no public undo). Can go when torch offers one.


def is_torch_compile_wrapper(obj: object) -> bool:
    """Whether ``obj`` is a ``torch.compile(module)`` wrapper (``OptimizedModule``, ``_orig_mod``)."""
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


def clear_compiled_call(module: nn.Module) -> None:
    """Undo ``module.compile()`` (there is no public undo; see above)."""
    set_compiled_call(module, None)


def eager_call(module: nn.Module, *args: Any, **kwargs: Any) -> Any:
    """Run ``module`` through its eager call path (hooks included), skipping a compiled call."""
    return module._call_impl(*args, **kwargs)


# --- marking tensors ------------------------------------------------------------------------
# Why: `torch._dynamo.mark_dynamic` / `mark_static_address` are the documented way to mark dims and
# addresses, but live under the private `torch._dynamo` namespace. Upstream: exposed as
# `torch.compiler` APIs only partly (pytorch#130090). Can go when `torch.compiler` has both.


def mark_dynamic(tensor: torch.Tensor, dim: int, *, min: int | None = None, max: int | None = None) -> None:  # noqa: A002
    """``torch._dynamo.mark_dynamic`` with its ``min``/``max`` bounds."""
    torch._dynamo.mark_dynamic(tensor, dim, min=min, max=max)


def mark_static_address(tensor: torch.Tensor) -> None:
    """``torch._dynamo.mark_static_address``: the address is a guard, not a graph input copy."""
    torch._dynamo.mark_static_address(tensor)


def reset() -> None:
    """``torch._dynamo.reset()``: forget every compiled graph and guard (a cold start)."""
    torch._dynamo.reset()


# --- counting -------------------------------------------------------------------------------
# Why: a benchmark row must say how many graphs dynamo really compiled and whether the recompile
# limit dropped a frame to eager. Upstream: `torch._dynamo.testing.CompileCounter` and
# `torch._dynamo.utils.counters` are testing/debug aids with no public twin; CompileMonitor
# (diagnostics) reads the structured trace instead. Can go when torch.compiler exposes counts.


def frame_counting_backend() -> Any:
    """A backend that counts frames (``.frame_count``) and runs the graph eagerly."""
    from torch._dynamo.testing import CompileCounter

    return CompileCounter()


def recompile_limit_hits() -> int:
    """How often dynamo gave up on a frame at the recompile limit since the last reset."""
    from torch._dynamo.utils import counters

    return sum(n for key, n in counters["unimplemented"].items() if "recompile_limit" in key)


# --- inductor -------------------------------------------------------------------------------


def inductor_freezing_enabled() -> bool:
    """The global ``torch._inductor.config.freezing`` (the PEFT freezing rules read it)."""
    import torch._inductor.config as inductor_config

    return bool(inductor_config.freezing)


@contextlib.contextmanager
def fresh_inductor_cache() -> Iterator[str]:
    """An empty inductor cache directory for the block, so a compile is truly cold.

    Why: inductor reuses compiled kernels from ``TORCHINDUCTOR_CACHE_DIR`` across runs; a
    benchmark that wants cold compile times must not see them. Upstream:
    ``torch._inductor.utils.fresh_cache`` (named ``fresh_inductor_cache`` before torch 2.8); the
    fallback points the environment variable at a temporary directory. Can go when torch exposes
    a public "cold start" switch.
    """
    try:
        from torch._inductor.utils import fresh_cache
    except ImportError:
        try:
            from torch._inductor.utils import fresh_inductor_cache as fresh_cache
        except ImportError:
            fresh_cache = None
    reset()
    try:
        if fresh_cache is not None:
            with tempfile.TemporaryDirectory(prefix="tck-inductor-") as tmp, fresh_cache(dir=tmp):
                yield tmp
        else:
            with tempfile.TemporaryDirectory(prefix="tck-inductor-") as tmp:
                old = os.environ.get("TORCHINDUCTOR_CACHE_DIR")
                os.environ["TORCHINDUCTOR_CACHE_DIR"] = tmp
                try:
                    yield tmp
                finally:
                    if old is None:
                        os.environ.pop("TORCHINDUCTOR_CACHE_DIR", None)
                    else:
                        os.environ["TORCHINDUCTOR_CACHE_DIR"] = old
    finally:
        reset()


# --- optimizer pieces ------------------------------------------------------------------------


@functools.cache
def foreach_map_op() -> Callable[..., Any] | None:
    """``torch._higher_order_ops.foreach_map.foreach_map``, or ``None`` before torch 2.7.

    Why: the horizontally fused optimizer step is built on it; it has no public name yet.
    Upstream: pytorch#138970 (foreach_map HOP). Can go when it is exported publicly.
    """
    try:
        from torch._higher_order_ops.foreach_map import foreach_map
    except ImportError:
        return None
    return foreach_map


def privateuse1_backend_name() -> str:
    """The name a PrivateUse1 device registered under (``torch._C``), for device checks."""
    return torch._C._get_privateuse1_backend_name()
