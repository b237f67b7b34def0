"""Compile cache: save what torch compiled, and start the next run warm — never silently wrong.

The topic's API. :func:`save_compile_cache` bundles torch's mega-cache with the compiled kernels
of the inductor cache dir under an environment header and a content hash; :func:`load_compile_cache`
verifies and installs it, refusing any artifact from another environment (torch, Python,
machine, device, GPU, Triton, CPU ISA, thread count); :func:`compile_cache` does both around a
training loop. Paths are local files or fsspec URLs (``pip install 'torchcompile-kit[remote]'``).

Modules: :mod:`.header` (environment header and its comparison), :mod:`.artifact` (archive
format, hash, safe installation), :mod:`.storage` (atomic local write, fsspec remote),
:mod:`.api` (save/load), :mod:`.session` (the context manager). Artifacts hold pickles: load
only from storage you trust.
"""

from .api import (
    CacheLoadResult,
    CacheSaveResult,
    CompileCacheWarning,
    load_compile_cache,
    save_compile_cache,
)
from .header import HeaderMismatch
from .session import CompileCacheSession, compile_cache

__all__ = [
    # results
    "CacheLoadResult",
    "CacheSaveResult",
    "CompileCacheSession",
    "CompileCacheWarning",
    "HeaderMismatch",
    # top level UX
    "compile_cache",
    "load_compile_cache",
    "save_compile_cache",
]
