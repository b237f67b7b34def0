"""The compile-cache archive: one self-checking blob, and its safe installation into inductor's dir.

Layout (little-endian)::

    b"TCKCACHE" | u32 format_version | u32 header_len | u64 body_len | sha256(header + body)
    | header (UTF-8 JSON: environment + contents) | body (zlib of the entries)

An entry is ``u32 name_len | name | u32 mode | u64 size | bytes``, named ``"mega-cache"`` or
``"kernels/<2 chars>/<file>"`` (the built kernels, which the mega-cache does not hold on CPU).
docs/cache.md ("Damaged artifacts, interrupted saves") says how a damaged artifact is refused and
kernels installed.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import struct
import tempfile
import zlib
from dataclasses import dataclass, field
from typing import Any

from .header import FORMAT_VERSION, HeaderMismatch

__all__ = [
    "Artifact",
    "ArtifactRefused",
    "ArtifactUnreadable",
    "collect_kernel_files",
    "install_kernel_files",
    "pack",
    "unpack",
]

MAGIC = b"TCKCACHE"
_PREFIX = struct.Struct("<8sIIQ")
_DIGEST_LEN = 32
MEGA_CACHE_ENTRY = "mega-cache"
_KERNEL_PREFIX = "kernels/"
# inductor's compiled-kernel folders are named by the first two characters of a base32 hash.
_KERNEL_DIR = re.compile(r"^[a-z0-9]{2}$")
# A kernel entry: one folder level, a plain file name (no "..", no hidden or temporary files).
_KERNEL_NAME = re.compile(r"^[a-z0-9]{2}/[A-Za-z0-9_][A-Za-z0-9_.\-]*$")


class ArtifactUnreadable(ValueError):
    """The bytes are not a whole, intact artifact (empty, truncated, corrupt, foreign)."""


class ArtifactRefused(ValueError):
    """The artifact is intact but was built in another environment."""

    def __init__(self, mismatches: list[HeaderMismatch]) -> None:
        self.mismatches = mismatches
        super().__init__("; ".join(str(m) for m in mismatches))


@dataclass(kw_only=True, slots=True)
class KernelFile:
    """One file of a compiled-kernel folder."""

    name: str
    """``"<2 chars>/<file name>"`` relative to the inductor cache dir."""
    mode: int
    """Permission bits to restore."""
    data: bytes = field(repr=False)
    """The file's bytes."""


@dataclass(kw_only=True, slots=True)
class Artifact:
    """An unpacked, hash-verified artifact."""

    header: dict[str, Any]
    """``{"environment": {...}, "contents": {...}}`` as written by :func:`pack`."""
    mega_cache: bytes | None = field(repr=False)
    """torch's mega-cache bytes, if the saving process compiled anything."""
    kernel_files: list[KernelFile] = field(default_factory=list, repr=False)
    """The compiled-kernel files to install into the inductor cache dir."""


def collect_kernel_files(cache_dir: str) -> list[KernelFile]:
    """Every file of the compiled-kernel folders (``<cache_dir>/<2 chars>/*``), sorted by name.

    Lock files, hidden and temporary files and sub-folders are left out; so are the ``fxgraph/``
    and ``aotautograd/`` entries, which travel in the mega-cache.
    """
    files: list[KernelFile] = []
    if not os.path.isdir(cache_dir):
        return files
    for folder in sorted(os.listdir(cache_dir)):
        folder_path = os.path.join(cache_dir, folder)
        if not _KERNEL_DIR.match(folder) or not os.path.isdir(folder_path):
            continue
        for name in sorted(os.listdir(folder_path)):
            path = os.path.join(folder_path, name)
            relative = f"{folder}/{name}"
            if not _KERNEL_NAME.match(relative) or name.endswith((".tmp", ".lock")):
                continue
            if not os.path.isfile(path) or os.path.islink(path):
                continue
            with open(path, "rb") as handle:
                data = handle.read()
            files.append(KernelFile(name=relative, mode=os.stat(path).st_mode & 0o777, data=data))
    return files


def pack(
    *,
    environment: dict[str, Any],
    mega_cache: bytes | None,
    kernel_files: list[KernelFile],
    contents: dict[str, Any],
) -> bytes:
    """The artifact bytes for ``environment`` holding ``mega_cache`` and ``kernel_files``."""
    entries: list[bytes] = []
    if mega_cache is not None:
        entries.append(_entry(MEGA_CACHE_ENTRY, 0o644, mega_cache))
    entries.extend(_entry(_KERNEL_PREFIX + f.name, f.mode, f.data) for f in kernel_files)
    body = zlib.compress(b"".join(entries), 1)  # level 1: kernels compress well, quickly
    header = json.dumps({"environment": environment, "contents": contents}, sort_keys=True).encode()
    digest = hashlib.sha256(header + body).digest()
    return _PREFIX.pack(MAGIC, FORMAT_VERSION, len(header), len(body)) + digest + header + body


def unpack(data: bytes, *, current_environment: dict[str, Any]) -> Artifact:
    """Verify ``data`` whole, compare its environment, and return its parts.

    Raises:
        ArtifactUnreadable: empty, truncated, extended, corrupt or not an artifact at all.
        ArtifactRefused: intact, but a header field differs from ``current_environment``.
    """
    from .header import compare_environment

    if not data:
        raise ArtifactUnreadable("the file is empty")
    if len(data) < _PREFIX.size + _DIGEST_LEN:
        raise ArtifactUnreadable(f"truncated: {len(data)} bytes is shorter than any artifact")
    magic, version, header_len, body_len = _PREFIX.unpack_from(data)
    if magic != MAGIC:
        raise ArtifactUnreadable(f"not a torchcompile_kit compile cache (starts with {magic!r})")
    if version != FORMAT_VERSION:
        raise ArtifactRefused(
            [HeaderMismatch(field="format_version", saved=version, current=FORMAT_VERSION)]
        )
    expected = _PREFIX.size + _DIGEST_LEN + header_len + body_len
    if len(data) != expected:
        kind = "truncated or half-uploaded" if len(data) < expected else "has trailing bytes"
        raise ArtifactUnreadable(f"{kind}: {len(data)} bytes, the header announces {expected}")
    start = _PREFIX.size + _DIGEST_LEN
    header_bytes = data[start : start + header_len]
    body = data[start + header_len :]
    if hashlib.sha256(header_bytes + body).digest() != data[_PREFIX.size : start]:
        raise ArtifactUnreadable("content hash mismatch: the file is corrupt or was modified")
    try:
        header = json.loads(header_bytes)
        raw = zlib.decompress(body)
    except (ValueError, zlib.error) as err:  # cannot happen with a matching hash, unless forged
        raise ArtifactUnreadable(f"undecodable content ({err})") from err
    # without the key (artifacts before it): CPU kernels assumed, every field compared
    cpu_kernels = header.get("contents", {}).get("cpu_kernels", True)
    mismatches = compare_environment(
        header.get("environment", {}), current_environment, cpu_kernels=cpu_kernels
    )
    if mismatches:
        raise ArtifactRefused(mismatches)
    artifact = Artifact(header=header, mega_cache=None)
    for name, mode, payload in _entries(raw):
        if name == MEGA_CACHE_ENTRY:
            artifact.mega_cache = payload
        elif name.startswith(_KERNEL_PREFIX) and _KERNEL_NAME.match(name[len(_KERNEL_PREFIX) :]):
            artifact.kernel_files.append(
                KernelFile(name=name[len(_KERNEL_PREFIX) :], mode=mode & 0o777, data=payload)
            )
        else:
            raise ArtifactUnreadable(f"unexpected entry {name!r}")
    return artifact


def install_kernel_files(files: list[KernelFile], cache_dir: str) -> int:
    """Place ``files`` into ``cache_dir`` without ever exposing a partial file; the count placed.

    Files are first written (and fsynced) into a hidden staging folder of ``cache_dir`` — same
    filesystem, so the final ``os.replace`` is atomic — and the staging folder is always removed.
    A file already present with the same size is kept (names are content hashes).
    """
    if not files:
        return 0
    os.makedirs(cache_dir, exist_ok=True)
    staging = tempfile.mkdtemp(prefix=".tck-staging-", dir=cache_dir)
    placed = 0
    try:
        staged: list[tuple[str, str]] = []
        for index, kernel in enumerate(files):
            target = os.path.join(cache_dir, kernel.name)
            if os.path.isfile(target) and os.path.getsize(target) == len(kernel.data):
                continue
            temp = os.path.join(staging, str(index))
            with open(temp, "wb") as handle:
                handle.write(kernel.data)
                handle.flush()
                os.fsync(handle.fileno())
            os.chmod(temp, kernel.mode or 0o644)
            staged.append((temp, target))
        for temp, target in staged:
            os.makedirs(os.path.dirname(target), exist_ok=True)
            os.replace(temp, target)
            placed += 1
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return placed


def _entry(name: str, mode: int, data: bytes) -> bytes:
    encoded = name.encode()
    return struct.pack("<I", len(encoded)) + encoded + struct.pack("<IQ", mode, len(data)) + data


def _entries(raw: bytes):
    offset = 0
    while offset < len(raw):
        try:
            (name_len,) = struct.unpack_from("<I", raw, offset)
            name = raw[offset + 4 : offset + 4 + name_len].decode()
            offset += 4 + name_len
            mode, size = struct.unpack_from("<IQ", raw, offset)
        except (struct.error, UnicodeDecodeError) as err:
            raise ArtifactUnreadable(f"malformed entry table at byte {offset}") from err
        offset += 12
        if offset + size > len(raw):
            raise ArtifactUnreadable(f"entry {name!r} runs past the end of the artifact")
        yield name, mode, raw[offset : offset + size]
        offset += size
