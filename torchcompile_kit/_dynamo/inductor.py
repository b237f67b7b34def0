"""Inductor's settings, its compile entry import and a fresh (cold) cache dir.

Part of the one door to torch's private compiler APIs (see ``_dynamo/__init__.py``)."""

from __future__ import annotations

import contextlib
import os
import tempfile
from collections.abc import Callable, Iterator
from typing import Any

import torch

__all__ = ["fresh_inductor_cache", "import_compiler", "inductor_freezing_enabled"]


# --- inductor -------------------------------------------------------------------------------


def inductor_freezing_enabled() -> bool:
    """The global ``torch._inductor.config.freezing`` (the PEFT freezing rules read it)."""
    import torch._inductor.config as inductor_config

    return bool(inductor_config.freezing)


def import_compiler() -> None:
    """Import dynamo and inductor's compile entry point now (seconds, once per process).

    Why: the first ``torch.compile`` call, cache load or compile in a process imports them, so
    their cost lands in whichever of those comes first. A benchmark that compares phases (a
    cold first step against a cache load plus a warm first step) imports them up front in every
    row, as it does torch itself. Upstream: ``torch._inductor.compile_fx`` is inductor's entry
    module (private; https://github.com/pytorch/pytorch/blob/main/torch/_inductor/compile_fx.py).
    Can go when torch imports its compiler eagerly or cheaply.
    """
    import torch._dynamo
    import torch._inductor.compile_fx  # noqa: F401


def _fresh_cache_fn() -> Callable[..., Any] | None:
    """inductor's own "fresh cache" context manager under its name for this torch, or ``None``."""
    import torch._inductor.utils as inductor_utils

    return getattr(inductor_utils, "fresh_cache", None) or getattr(
        inductor_utils, "fresh_inductor_cache", None
    )


@contextlib.contextmanager
def fresh_inductor_cache() -> Iterator[str]:
    """An empty inductor cache directory for the block, so a compile is truly cold.

    Why: inductor reuses compiled kernels from ``TORCHINDUCTOR_CACHE_DIR`` across runs; a
    benchmark that wants cold compile times must not see them. Upstream:
    ``torch._inductor.utils.fresh_cache`` (older releases call it ``fresh_inductor_cache``; 2.13
    has both); the fallback points the environment variable at a temporary directory. Can go when
    torch exposes a public "cold start" switch.
    """
    fresh_cache = _fresh_cache_fn()
    torch.compiler.reset()
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
        torch.compiler.reset()
