"""``compile_cache(path)``: load on enter, save after ``save_after`` steps (a crash still leaves a
cache) and on exit; a save that would write the same bytes as the last one is skipped.
"""

from __future__ import annotations

import contextlib
import logging
import os
import warnings
from collections.abc import Iterator
from dataclasses import dataclass, field

from .._checks import check_positive_int
from ..diagnostics import CompileMonitor
from . import storage
from .api import (
    CacheLoadResult,
    CacheSaveResult,
    CompileCacheWarning,
    load_with_keys,
    save_if_changed,
)
from .signature import KeyArg, Keys, resolve_keys

__all__ = ["CompileCacheSession", "compile_cache"]

logger = logging.getLogger(__name__)


@dataclass(kw_only=True, slots=True)
class CompileCacheSession:
    """The object ``with compile_cache(path) as cache:`` gives: what was loaded, a save switch."""

    path: str
    """The artifact's path or URL."""
    save_after: int | None = None
    """Save once after this many :meth:`step` calls (``None``: only on exit or :meth:`save`)."""
    barrier: bool = True
    """In a distributed job, saves wait for every rank's write (every rank must reach them)."""
    loaded: CacheLoadResult | None = None
    """The result of the load on enter (``None`` when ``load=False``)."""
    saved: CacheSaveResult | None = None
    """The result of the last save (``None`` before the first)."""
    steps: int = 0
    """How many times :meth:`step` was called."""
    monitor: CompileMonitor | None = None
    """The ``CompileMonitor`` recording compiles (and cache hits) inside the block."""
    keys: Keys = field(default_factory=Keys, repr=False)
    """The keys its load checks and its saves sign with (their ids only, when printed)."""
    _digest: str = field(default="", repr=False)

    def step(self) -> None:
        """Count one training step; saves when the count reaches ``save_after``.

        Example:
            >>> with compile_cache("ckpt/cc.tck", save_after=1) as cache:  # doctest: +SKIP
            ...     for batch in loader:
            ...         train_step(batch)
            ...         cache.step()  # after step 1 the cache exists, even if step 900 crashes
        """
        self.steps += 1
        if self.save_after is not None and self.steps == self.save_after:
            self.save()

    def save(self) -> CacheSaveResult:
        """Save now (skipped when nothing new was compiled since the last save).

        Returns:
            The :class:`CacheSaveResult` (also kept in ``saved``).
        """
        self.saved = save_if_changed(
            self.path, barrier=self.barrier, unchanged_digest=self._digest, keys=self.keys
        )
        if self.saved.digest and self.saved.saved:
            self._digest = self.saved.digest
        return self.saved

    def cache_stats(self) -> dict[str, int]:
        """Cache hits and misses inside the block (``cache_hits``/``cache_misses`` and the four
        torch counters they sum), as the session's ``CompileMonitor`` saw them; empty before the
        block."""
        if self.monitor is None:
            return {}
        snapshot = self.monitor.snapshot()
        return {
            "cache_hits": snapshot["cache_hits"],
            "cache_misses": snapshot["cache_misses"],
            **self.monitor.cache(),
        }


@contextlib.contextmanager
def compile_cache(
    path: str | os.PathLike[str],
    *,
    load: bool = True,
    save_on_exit: bool = True,
    save_after: int | None = None,
    barrier: bool = True,
    key: KeyArg = None,
) -> Iterator[CompileCacheSession]:
    """Load the compile cache at ``path`` on enter (if there is one) and save it on exit.

    Enter it in a fresh process before the first compiled step. On exit, also when the block raises,
    the cache is saved unless nothing new was compiled; a failing save never hides the block's own
    exception.

    Args:
        path: a local file path or fsspec URL (``s3://``, ``gs://``, ``file://``, ``memory://``).
        load: load the artifact on enter.
        save_on_exit: save on exit.
        save_after: also save once after this many ``cache.step()`` calls, so a later crash still
            leaves a cache.
        barrier: in a distributed job, make saves collective (each rank writes its own artifact,
            :func:`rank_path`; all wait).
        key: sign saves with it and refuse to load an artifact not signed with it (a string or
            bytes; a list: the first signs, any is accepted). ``None``: the key in
            ``$TORCHCOMPILE_KIT_CACHE_KEY``, if set (docs/cache.md, "Security").

    Returns:
        A context manager yielding a :class:`CompileCacheSession`.

    Raises:
        ValueError: ``save_after`` is not a positive int, or ``key`` is empty.
        TypeError: ``key`` is not a string, bytes or a list of them.
        ImportError: ``path`` is a URL and fsspec is not installed.

    Example:
        >>> with compile_cache("s3://bucket/run-7/cc.tck", save_after=1) as cache:  # doctest: +SKIP
        ...     for batch in loader:
        ...         train_step(batch)
        ...         cache.step()  # doctest: +NORMALIZE_WHITESPACE
    """
    if save_after is not None:
        check_positive_int("save_after", save_after)
    target = storage.resolve_path(path, caller="compile_cache")
    storage.check_storage(target)  # a missing fsspec fails now, not on exit
    keys = resolve_keys(key, caller="compile_cache")
    session = CompileCacheSession(
        path=os.fspath(path), save_after=save_after, barrier=barrier, keys=keys
    )
    if load:
        session.loaded = load_with_keys(session.path, keys)
    session.monitor = CompileMonitor().start()
    try:
        yield session
    except BaseException:
        if save_on_exit:
            # No barrier: the other ranks may not be failing, and would never reach it.
            session.barrier = False
            try:
                session.save()
            except Exception as err:  # noqa: BLE001 - the block's own exception is the one that matters
                warnings.warn(
                    f"compile cache not saved to {session.path!r} after an error: "
                    f"{type(err).__name__}: {err}",
                    CompileCacheWarning,
                    stacklevel=3,
                )
        raise
    finally:
        session.monitor.stop()
        stats = session.cache_stats()
        logger.info(
            "compile cache %r: %d cache hits, %d misses in the block",
            session.path,
            stats["cache_hits"],
            stats["cache_misses"],
        )
    if save_on_exit:
        session.save()
