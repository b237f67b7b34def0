"""Inductor's settings, its compile entry import and a fresh (cold) cache dir.

Part of the one door to torch's private compiler APIs (see ``_dynamo/__init__.py``)."""

from __future__ import annotations

import contextlib
import tempfile
from collections.abc import Iterator

import torch

__all__ = [
    "fresh_inductor_cache",
    "header_precompiles",
    "import_compiler",
    "inductor_freezing_enabled",
    "loading_built_kernels",
]


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


# --- inductor's precompiled C++ header -----------------------------------------------------------
# Why: before inductor loads a CPU kernel library not yet loaded in the process, it makes sure its
# C++ prelude has a precompiled header (`codecache._precompile_header`, functools.cache'd per
# process): it preprocesses the prelude with the C++ compiler and, where the header is not yet in
# `<tempdir>/torchinductor_<user>/precompiled_headers` (a folder of the machine, not the inductor
# cache dir, so no compile cache brings it), compiles it — also when the library is already built,
# as on a warm start, which compiles no C++. Measured (the 12-layer GPT-2 restart, blocks
# precompiled, 2-core CPU, torch 2.13 and 2.15): 0.13 s of a 0.7 s warm first step where the header
# was built before, 4.3 s more on a machine where it was not (a fresh container). The header only
# speeds up compiles: a library's cache key is computed without it (`CppCodeCache.load_async`,
# torch 2.10 to 2.15), and `-include` of a plain header that includes the prelude compiles the
# same code. So while a compile cache's kernels load, inductor gets that plain header instead;
# a compile needing the real one later in the process makes it then.
# Upstream: https://github.com/pytorch/pytorch/blob/main/torch/_inductor/codecache.py
# Can go when inductor looks for the built library before it makes the header.


@contextlib.contextmanager
def loading_built_kernels() -> Iterator[None]:
    """Inductor loads kernel libraries without its precompiled C++ header in this block (a
    library built in it compiles the same code, slower)."""
    from torch._inductor import codecache

    real = codecache._precompile_header
    codecache._precompile_header = _plain_header
    try:
        yield
    finally:
        codecache._precompile_header = real


def _plain_header(header: str, hashable_cmd_line: str, **compile_command: object) -> str:
    """A header that includes ``header``, in place of its precompiled form."""
    import hashlib
    import os

    from torch._inductor.runtime.cache_dir_utils import cache_dir

    folder = os.path.join(cache_dir(), "tck_plain_headers")
    path = os.path.join(folder, hashlib.sha256(header.encode()).hexdigest()[:20] + ".h")
    if not os.path.exists(path):
        os.makedirs(folder, exist_ok=True)
        partial = f"{path}.{os.getpid()}.tmp"
        with open(partial, "w") as file:
            file.write(f"#include <{header}>\n")
        os.replace(partial, path)
    return path


def header_precompiles() -> int:
    """How many times inductor asked for its precompiled C++ header in this process (the first
    ask for a header makes or checks it)."""
    from torch._inductor.codecache import _precompile_header

    info = _precompile_header.cache_info()
    return int(info.hits + info.misses)
