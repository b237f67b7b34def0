"""Where artifacts live: a local file written atomically (temporary file, fsync, ``os.replace``),
or one whole-object put behind an fsspec URL (optional, imported only for such a URL; a partial
upload is caught on read by the artifact's length and hash checks).
"""

from __future__ import annotations

import os
import tempfile
from typing import Any
from urllib.parse import unquote, urlparse

__all__ = ["DEFAULT_FILE_NAME", "check_storage", "read_bytes", "resolve_path", "write_bytes"]

DEFAULT_FILE_NAME = "compile-cache.tck"
"""The artifact's name when ``path`` names a folder (ends with ``/`` or is an existing dir)."""

_CHUNK_BYTES = 1 << 20
_REMOTE_HINT = "pip install 'torchcompile-kit[remote]'"


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
        raise ImportError(f"compile cache path {url!r} is a URL, which needs fsspec (and the "
                          "filesystem's own package, e.g. s3fs for s3://); install it with "
                          f"{_REMOTE_HINT}, or pass a local path.") from err
    return fsspec.core.url_to_fs(url)


def check_storage(path: str) -> None:
    """Raise now (on every rank) if ``path`` needs a package that is not installed.

    Raises:
        ImportError: ``path`` is a remote URL and fsspec (or its filesystem) is missing.
    """
    if _local_path(path) is None:
        _filesystem(path)


def resolve_path(path: str | os.PathLike[str]) -> str:
    """``path`` as a string, with :data:`DEFAULT_FILE_NAME` appended when it names a folder."""
    path = os.fspath(path)
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
                return handle.read()
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
    folder = os.path.dirname(os.path.abspath(local))
    os.makedirs(folder, exist_ok=True)
    descriptor, temp = tempfile.mkstemp(dir=folder, prefix=f".{os.path.basename(local)}.",
                                        suffix=".tmp")
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
    _fsync_folder(folder)


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
