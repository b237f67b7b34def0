"""The compile cache: inductor's cache dir, torch's mega-cache and its counters.

Part of the one door to torch's private compiler APIs (see ``_dynamo/__init__.py``)."""

from __future__ import annotations

import os

import torch

from .precompile import dynamo_cache_counters

__all__ = [
    "compile_cache_counters",
    "cpu_capability",
    "inductor_cache_dir",
    "load_mega_cache",
    "save_mega_cache",
]


# --- compile cache ---------------------------------------------------------------------------
# The cache topic (torchcompile_kit/cache) bundles torch's mega-cache with the inductor cache dir's
# compiled kernel folders. Mega-cache: `torch.compiler.save_cache_artifacts` /
# `load_cache_artifacts` are public (https://docs.pytorch.org/docs/main/generated/
# torch.compiler.save_cache_artifacts.html, tutorial recipes/torch_compile_caching_tutorial) but
# not in every supported torch, so they are probed here.


def inductor_cache_dir() -> str:
    """The inductor cache directory this process compiles into (absolute; may not exist yet).

    Why: the CPU kernels (``.so``) that make a restart fast live there, not in the mega-cache.
    ``TORCHINDUCTOR_CACHE_DIR`` wins; otherwise torch's default, computed by the private
    ``torch._inductor.runtime.cache_dir_utils.default_cache_dir`` (``/tmp/torchinductor_<user>``).
    Its public ``cache_dir()`` twin is not used because it writes the environment variable and
    creates the folder. Upstream: documented in
    https://docs.pytorch.org/tutorials/recipes/torch_compile_caching_configuration_tutorial.html;
    no public function. Can go when ``torch.compiler`` exposes the cache dir.
    """
    directory = os.environ.get("TORCHINDUCTOR_CACHE_DIR")
    if not directory:
        from torch._inductor.runtime.cache_dir_utils import default_cache_dir

        directory = default_cache_dir()
    return os.path.abspath(directory)


def save_mega_cache() -> tuple[bytes, dict[str, int]] | None:
    """The mega-cache bytes of everything compiled (or hit) in this process, with entry counts.

    Returns ``None`` when nothing was compiled.
    """
    result = torch.compiler.save_cache_artifacts()
    if result is None:
        return None
    data, info = result
    return data, {kind: len(keys) for kind, keys in info.artifacts.items()}


def load_mega_cache(data: bytes) -> dict[str, int] | None:
    """Hot-load mega-cache bytes into the inductor caches; entry counts, or ``None``
    if unreadable."""
    info = torch.compiler.load_cache_artifacts(data)
    if info is None:
        return None
    return {kind: len(keys) for kind, keys in info.artifacts.items()}


def compile_cache_counters() -> dict[str, int]:
    """Process-wide inductor FX-graph, AOTAutograd and dynamo precompile cache hits/misses since the
    last reset.

    Why: the cache must report whether a load paid off; the counts come from
    ``torch._dynamo.utils.counters`` (private; names verified in torch 2.13
    ``_inductor/codecache.py`` and ``_functorch/_aot_autograd/autograd_cache.py``). The diagnostics
    CompileMonitor may take this over. Can go when torch.compiler exposes cache statistics.
    """
    from torch._dynamo.utils import counters

    return {
        "fxgraph_cache_hit": int(counters["inductor"]["fxgraph_cache_hit"]),
        "fxgraph_cache_miss": int(counters["inductor"]["fxgraph_cache_miss"]),
        "autograd_cache_hit": int(counters["aot_autograd"]["autograd_cache_hit"]),
        "autograd_cache_miss": int(counters["aot_autograd"]["autograd_cache_miss"]),
        **dynamo_cache_counters(),
    }


def cpu_capability() -> str:
    """The CPU vector ISA ATen dispatches to (``"AVX512"``, ``"AVX2"``, ``"DEFAULT"``, ...).

    Public (``torch.backends.cpu.get_cpu_capability``); here because inductor's CPU cache keys do
    not include it (measured: an AVX-512 cache reused under AVX2 gave hits and a NaN loss).
    """
    return str(torch.backends.cpu.get_cpu_capability())
