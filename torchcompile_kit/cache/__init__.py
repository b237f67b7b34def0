"""Compile cache: save what torch compiled, and start the next run warm — never silently wrong.

:func:`save_compile_cache`, :func:`load_compile_cache` and :func:`compile_cache` (both around a
training loop); :mod:`.header` (the environment header), :mod:`.artifact` (format and safe
installation), :mod:`.storage` (local and fsspec paths). Artifacts hold pickles: load only from
storage you trust. docs/cache.md is the guide.
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
    "CacheLoadResult", "CacheSaveResult", "CompileCacheSession", "CompileCacheWarning",
    "HeaderMismatch",
    # top level UX
    "compile_cache", "load_compile_cache", "save_compile_cache",
]
