"""Compile cache: save what torch compiled, and start the next run warm — never silently wrong.

:func:`save_compile_cache`, :func:`load_compile_cache` and :func:`compile_cache` (both around a
training loop); :mod:`.header` (the environment header), :mod:`.artifact` (format and safe
installation), :mod:`.signature` (signed artifacts), :mod:`.storage` (local and fsspec paths).
Artifacts hold pickles: sign them with a key, or load only from storage only you can write.
docs/cache.md is the guide.
"""

from .api import (
    CacheLoadResult,
    CacheSaveResult,
    CompileCacheWarning,
    load_compile_cache,
    load_with_keys,
    rank_path,
    save_compile_cache,
)
from .header import HeaderMismatch, current_environment
from .session import CompileCacheSession, compile_cache
from .signature import ENV_KEY, Keys, SignatureRefused, read_signed, resolve_keys, write_signed
from .storage import resolve_path

__all__ = [
    # the environment variable a key is read from (docs/cache.md, "Security")
    "ENV_KEY",
    # results; a refused signature; the keys of a save or load
    "CacheLoadResult",
    "CacheSaveResult",
    "CompileCacheSession",
    "CompileCacheWarning",
    "HeaderMismatch",
    "Keys",
    "SignatureRefused",
    # top level UX, and for other topics the files the library writes and reads back (a
    # background compile's hand-off: read_signed, resolve_keys, write_signed), signed alike, and
    # the check of a path argument (resolve_path: the Trainer's compile_cache=); the artifact a
    # rank reads and writes (rank_path), and a load of one artifact on every rank (load_with_keys:
    # the background worker's); what an artifact's header records of this process
    # (current_environment: the bench records it with its results)
    "compile_cache",
    "current_environment",
    "load_compile_cache",
    "load_with_keys",
    "rank_path",
    "read_signed",
    "resolve_keys",
    "resolve_path",
    "save_compile_cache",
    "write_signed",
]
