"""Inductor's settings, its compile entry import and a fresh (cold) cache dir.

Part of the one door to torch's private compiler APIs (see ``_dynamo/__init__.py``)."""

from __future__ import annotations

import contextlib
import tempfile
from collections.abc import Iterator

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


@contextlib.contextmanager
def fresh_inductor_cache() -> Iterator[str]:
    """An empty inductor cache directory for the block, so a compile is truly cold.

    Why: inductor reuses compiled kernels from ``TORCHINDUCTOR_CACHE_DIR`` across runs; a
    benchmark that wants cold compile times must not see them. Upstream:
    ``torch._inductor.utils.fresh_cache`` (private). Can go when torch exposes a public "cold
    start" switch.
    """
    from torch._inductor.utils import fresh_cache

    torch.compiler.reset()
    try:
        with tempfile.TemporaryDirectory(prefix="tck-inductor-") as tmp, fresh_cache(dir=tmp):
            yield tmp
    finally:
        torch.compiler.reset()
