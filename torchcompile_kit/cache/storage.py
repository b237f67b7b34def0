"""Where artifacts live: a local file written atomically (temporary file, fsync, ``os.replace``),
or one whole-object put behind an fsspec URL (optional, imported only for such a URL; a partial
upload is caught on read by the artifact's length and hash checks).

A local save holds ``.<name>.lock`` (``flock``) while it writes, sweeps the temporaries that earlier
saves of this path left behind (``kill -9`` mid-write), and refuses, with
:class:`ConcurrentSaveError`, to replace an artifact that another process saved there after this
one started (the lock file names the last save) and that this process never read: two jobs saving
to one path keep the first artifact, and the second is told. Nothing of this exists for a URL:
there the last writer wins.
"""

from __future__ import annotations

import contextlib
import os
import socket
import tempfile
import time
from collections.abc import Iterator
from typing import Any
from urllib.parse import unquote, urlparse

__all__ = [
    "DEFAULT_FILE_NAME",
    "ConcurrentSaveError",
    "check_storage",
    "read_bytes",
    "resolve_path",
    "write_bytes",
]

DEFAULT_FILE_NAME = "compile-cache.tck"
"""The artifact's name when ``path`` names a folder (ends with ``/`` or is an existing dir)."""

_CHUNK_BYTES = 1 << 20
_REMOTE_HINT = "pip install 'torchcompile-kit[remote]'"
_STALE_TEMP_S = 3600.0
"""A temporary of this path older than this, whose writer cannot be checked, is a leftover."""
_STARTED = time.time()
"""When this process loaded this module: a later save by another process is a concurrent job's."""
_SEEN: dict[str, tuple[int, int]] = {}
"""Local artifact path -> (mtime_ns, size) of the artifact this process last read or wrote there."""


class ConcurrentSaveError(OSError):
    """Another process is saving to this path, or saved to it after this process started: its
    artifact is kept and this one is not written (docs/cache.md, "One path, one job")."""


def _local_path(path: str) -> str | None:
    """The filesystem path for a local ``path``/``file://`` URL, else ``None`` (a remote URL)."""
    if "://" not in path:
        return path
    parsed = urlparse(path)
    if parsed.scheme == "file":
        return unquote(parsed.netloc + parsed.path)
    return None


def _filesystem(url: str) -> tuple[Any, str]:
    try:
        import fsspec
    except ImportError as err:
        raise ImportError(
            f"compile cache path {url!r} is a URL, which needs fsspec (and the "
            "filesystem's own package, e.g. s3fs for s3://); install it with "
            f"{_REMOTE_HINT}, or pass a local path."
        ) from err
    return fsspec.core.url_to_fs(url)


def check_storage(path: str) -> None:
    """Raise now (on every rank) if ``path`` needs a package that is not installed.

    Raises:
        ImportError: ``path`` is a remote URL and fsspec (or its filesystem) is missing.
    """
    if _local_path(path) is None:
        _filesystem(path)


def resolve_path(path: str | os.PathLike[str], *, caller: str = "compile cache") -> str:
    """``path`` as a string, with :data:`DEFAULT_FILE_NAME` appended when it names a folder.

    Raises:
        TypeError: ``path`` is not a string or ``os.PathLike`` (``caller`` names the function).
        ValueError: ``path`` is empty.
    """
    if not isinstance(path, (str, os.PathLike)):
        raise TypeError(
            f"{caller}: path={path!r:.80} is not a path; pass a file path, a folder or "
            "an fsspec URL, e.g. 'checkpoints/compile-cache.tck' or "
            "'s3://bucket/run-7/cc.tck'"
        )
    path = os.fspath(path)
    if not isinstance(path, str) or not path:
        raise ValueError(
            f"{caller}: path={path!r} is empty or not text; pass a file path, a folder "
            "or an fsspec URL"
        )
    local = _local_path(path)
    if path.endswith("/") or (local is not None and os.path.isdir(local)):
        return path.rstrip("/") + "/" + DEFAULT_FILE_NAME
    return path


def read_bytes(path: str) -> bytes | None:
    """The whole artifact at ``path``, or ``None`` when there is none.

    Raises:
        OSError: the storage could not be read (permissions, network, ...).
        ImportError: ``path`` is a remote URL and fsspec is missing.
    """
    local = _local_path(path)
    if local is not None:
        try:
            with open(local, "rb") as handle:
                data = handle.read()
                _SEEN[os.path.abspath(local)] = _identity(os.fstat(handle.fileno()))
                return data
        except FileNotFoundError:
            return None
    fs, fs_path = _filesystem(path)
    try:
        return bytes(fs.cat_file(fs_path))
    except FileNotFoundError:
        return None


def write_bytes(path: str, data: bytes) -> None:
    """Store ``data`` at ``path`` atomically: whole or not at all, the previous one kept on error.

    Raises:
        ConcurrentSaveError: (local path) another process is saving to it now, or wrote the artifact
            there after this process started without this process reading it; that one is kept.
        OSError: the storage could not be written (the previous artifact is left untouched).
        ImportError: ``path`` is a remote URL and fsspec is missing.
    """
    local = _local_path(path)
    if local is None:
        fs, fs_path = _filesystem(path)
        parent = fs_path.rsplit("/", 1)[0]
        if parent and parent != fs_path:
            fs.makedirs(parent, exist_ok=True)
        fs.pipe_file(fs_path, data)  # one whole-object put
        return
    local = os.path.abspath(local)
    folder, name = os.path.split(local)
    os.makedirs(folder, exist_ok=True)
    with _save_lock(local) as lock:
        _refuse_a_concurrent_jobs_artifact(local, lock)
        _sweep_temporaries(folder, name)
        descriptor, temp = tempfile.mkstemp(dir=folder, prefix=_temp_prefix(name), suffix=".tmp")
        try:
            with os.fdopen(descriptor, "wb") as handle:
                view = memoryview(data)
                for start in range(0, len(view), _CHUNK_BYTES):
                    _write_chunk(handle, view[start : start + _CHUNK_BYTES])
                handle.flush()
                os.fsync(handle.fileno())
            os.chmod(temp, 0o644)  # mkstemp makes it owner-only; other ranks/users may read it
            os.replace(temp, local)
        except BaseException:
            # Interrupted (error, KeyboardInterrupt): drop the partial temp, keep the old artifact.
            try:
                os.unlink(temp)
            except FileNotFoundError:
                pass
            raise
        _SEEN[local] = _identity(os.stat(local))
        _record_writer(lock, _SEEN[local])
    _fsync_folder(folder)


def _identity(stat: os.stat_result) -> tuple[int, int]:
    return stat.st_mtime_ns, stat.st_size


def _host() -> str:
    return socket.gethostname().replace(".", "_")


@contextlib.contextmanager
def _save_lock(local: str) -> Iterator[Any]:
    """Hold ``.<name>.lock`` beside ``local`` for one save (another save of it now raises); the
    file names the last writer: ``host pid mtime_ns size`` of the artifact it wrote."""
    folder, name = os.path.split(local)
    with open(os.path.join(folder, f".{name}.lock"), "a+") as lock:
        try:
            import fcntl
        except ImportError:  # no flock (Windows): saves are not serialized
            yield lock
            return
        try:
            fcntl.flock(lock.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise ConcurrentSaveError(
                f"another process is saving to {local!r} right now; its artifact is kept and this "
                "process's is not written. Give each job a path of its own."
            ) from None
        try:
            yield lock
        finally:
            fcntl.flock(lock.fileno(), fcntl.LOCK_UN)


def _record_writer(lock: Any, identity: tuple[int, int]) -> None:
    lock.seek(0)
    lock.truncate()
    lock.write(f"{_host()} {os.getpid()} {identity[0]} {identity[1]}\n")
    lock.flush()


def _refuse_a_concurrent_jobs_artifact(local: str, lock: Any) -> None:
    """Raise if the artifact at ``local`` is one another process saved here (the lock file names
    it) after this process started, and this process has not read it."""
    try:
        stat = os.stat(local)
    except FileNotFoundError:
        return
    lock.seek(0)
    host, pid, *identity = (lock.read().split() + ["", "", "", ""])[:4]
    if (
        _identity(stat) == _SEEN.get(local)  # read (or written) by this process: a save includes it
        or stat.st_mtime < _STARTED  # an earlier job's: replaced as a save should
        or [str(n) for n in _identity(stat)] != identity  # not what a save of the library wrote
        or (host, pid) == (_host(), str(os.getpid()))
    ):
        return
    written = time.strftime("%H:%M:%S", time.localtime(stat.st_mtime))
    raise ConcurrentSaveError(
        f"{local!r} was saved at {written} by another process (pid {pid} on {host}), after this "
        "one "
        "started, and this process never read it: saving over it would discard that job's compiled "
        "code. It is kept and this process's artifact is not written. Give each job a path of its "
        "own, or load the artifact before compiling (compile_cache does) so a save includes it."
    )


def _temp_prefix(name: str) -> str:
    """``.<name>.<host>.<pid>.``: a later save can tell a leftover of a dead writer on this host."""
    return f".{name}.{_host()}.{os.getpid()}."


def _sweep_temporaries(folder: str, name: str) -> None:
    """Remove the temporaries earlier saves of ``name`` left (a writer killed mid-write): those of a
    process of this host that is gone, and any older than an hour (another host's, or unnamed)."""
    prefix, host = f".{name}.", _host()
    with os.scandir(folder) as entries:
        temps = [e for e in entries if e.name.startswith(prefix) and e.name.endswith(".tmp")]
    for entry in temps:
        parts = entry.name[len(prefix) :].split(".")
        dead = (
            len(parts) >= 3
            and parts[0] == host
            and parts[1].isdigit()
            and not _alive(int(parts[1]))
        )
        try:
            if dead or time.time() - entry.stat().st_mtime > _STALE_TEMP_S:
                os.unlink(entry.path)
        except FileNotFoundError:
            pass


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process
        return True
    return True


def _write_chunk(handle: Any, chunk: memoryview) -> None:
    handle.write(chunk)


def _fsync_folder(folder: str) -> None:
    # Makes the rename itself durable; not every platform can open a folder (Windows).
    try:
        descriptor = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(descriptor)
    except OSError:
        pass
    finally:
        os.close(descriptor)
