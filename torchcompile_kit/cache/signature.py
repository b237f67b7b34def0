"""Signed artifacts: who wrote a compile cache, checked before anything in it is used.

A compile cache is code: pickles and shared libraries loaded into the training process. Its content
hash catches corruption, but anyone who can write the file can recompute it. With a key (``key=``
or ``$TORCHCOMPILE_KIT_CACHE_KEY``), a save appends a trailer::

    b"TCKSIGN1" | key id (8 bytes) | HMAC-SHA256(key, artifact + b"TCKSIGN1" + key id)

and a load checks it on the raw bytes, before the header is parsed, a kernel written or a pickle
loaded. Only a holder of the key can make a trailer that checks. The key id (a hash of the key, not
the key) lets a refusal say which key signed. docs/cache.md ("Security") has the threat model.
"""

from __future__ import annotations

import hashlib
import hmac
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from ..errors import SignatureRefused

__all__ = [
    "ENV_KEY",
    "KeyArg",
    "Keys",
    "SignatureRefused",
    "check",
    "key_id",
    "read_signed",
    "resolve_keys",
    "sign",
    "split",
    "write_signed",
]

ENV_KEY = "TORCHCOMPILE_KIT_CACHE_KEY"
"""The environment variable a key is taken from when no ``key=`` is passed (several keys:
separated by commas; the first signs, any of them is accepted)."""
_MAGIC = b"TCKSIGN1"
_ID_LEN = 8
_TRAILER_LEN = len(_MAGIC) + _ID_LEN + hashlib.sha256().digest_size

KeyArg = str | bytes | Sequence[str | bytes] | None


@dataclass(frozen=True, slots=True)
class Keys:
    """The keys of one save or load (never printed: ``repr`` shows their ids only)."""

    accepted: tuple[bytes, ...] = ()
    """Every key a load accepts; the first also signs. Empty: no key set."""
    source: str = ""
    """Where they came from: ``"key="`` or ``"$TORCHCOMPILE_KIT_CACHE_KEY"``."""

    def __repr__(self) -> str:
        ids = ", ".join(key_id(k) for k in self.accepted)
        return f"Keys(ids=[{ids}], source={self.source!r})"

    @property
    def signing(self) -> bytes | None:
        """The key a save signs with (the first), or ``None``."""
        return self.accepted[0] if self.accepted else None


def resolve_keys(key: KeyArg, *, caller: str) -> Keys:
    """The keys ``key=`` names, else ``$TORCHCOMPILE_KIT_CACHE_KEY``'s, else none.

    Raises:
        TypeError: ``key`` is not a string, bytes, or a sequence of them.
        ValueError: a key is empty.

    Example:
        >>> resolve_keys("s3cret", caller="save_compile_cache").signing
        b's3cret'
        >>> resolve_keys(None, caller="load_compile_cache").accepted == tuple(
        ...     k.encode() for k in os.environ.get(ENV_KEY,  # doctest: +NORMALIZE_WHITESPACE
        ...     "").split(",") if k)
        True
    """
    if key is None:
        text = os.environ.get(ENV_KEY, "")
        keys = tuple(part.strip().encode() for part in text.split(",") if part.strip())
        return Keys(accepted=keys, source=f"${ENV_KEY}" if keys else "")
    items = [key] if isinstance(key, (str, bytes)) else key
    if (
        not isinstance(items, Sequence)
        or not items
        or not all(isinstance(k, (str, bytes)) for k in items)
    ):
        raise TypeError(
            f"{caller}: key must be a string or bytes (or a list of them: the first "
            f"signs, any is accepted), got {type(key).__name__}; or leave it out and "
            f"set ${ENV_KEY}."
        )
    keys = tuple(k.encode() if isinstance(k, str) else bytes(k) for k in items)
    if any(not k for k in keys):
        raise ValueError(
            f"{caller}: key must not be empty; generate one with "
            'python -c "import secrets; print(secrets.token_hex(32))".'
        )
    return Keys(accepted=keys, source="key=")


def key_id(key: bytes) -> str:
    """A short name for a key that does not reveal it (16 hex digits of a hash of it).

    Example:
        >>> len(key_id(b"s3cret"))
        16
    """
    return hashlib.sha256(b"torchcompile-kit key id\0" + key).digest()[:_ID_LEN].hex()


def sign(data: bytes, key: bytes) -> bytes:
    """``data`` with the signature trailer appended.

    Example:
        >>> signed = sign(b"artifact", b"s3cret")
        >>> split(signed)[0]
        b'artifact'
    """
    tail = _MAGIC + bytes.fromhex(key_id(key))
    return data + tail + hmac.new(key, data + tail, hashlib.sha256).digest()


def split(data: bytes) -> tuple[bytes, bytes | None]:
    """``(artifact, trailer)``: the trailer, when ``data`` ends in one, else ``None``."""
    if len(data) > _TRAILER_LEN and data[-_TRAILER_LEN:][: len(_MAGIC)] == _MAGIC:
        return data[:-_TRAILER_LEN], data[-_TRAILER_LEN:]
    return data, None


def check(artifact: bytes, trailer: bytes | None, keys: Keys) -> str:
    """Check ``trailer`` against ``keys``; return what was found, in words, or raise.

    Without keys nothing is checked (a trailer's key id is reported). With keys, a missing trailer,
    a trailer of another key or one whose HMAC does not match is :class:`SignatureRefused`.

    Example:
        >>> check(*split(sign(b"artifact", b"k")), resolve_keys(  # doctest: +NORMALIZE_WHITESPACE
        ...     "k", caller="load"))[:8]
        'verified'
    """
    signed_by = None if trailer is None else trailer[len(_MAGIC) : len(_MAGIC) + _ID_LEN].hex()
    if not keys.accepted:
        return (
            "unsigned"
            if signed_by is None
            else f"signed by key {signed_by}, not checked (no key set)"
        )
    if trailer is None:
        raise SignatureRefused(
            f"it is not signed, and a key is set ({keys.source}): an unsigned "
            "artifact may have been written by anyone who can write its path"
        )
    ids = [key_id(k) for k in keys.accepted]
    if signed_by not in ids:
        raise SignatureRefused(
            f"it was signed with key {signed_by}, not with the key set "
            f"({keys.source}: {', '.join(ids)})"
        )
    key = keys.accepted[ids.index(signed_by)]
    expected = hmac.new(key, artifact + trailer[: len(_MAGIC) + _ID_LEN], hashlib.sha256).digest()
    if not hmac.compare_digest(expected, trailer[len(_MAGIC) + _ID_LEN :]):
        raise SignatureRefused(
            f"its signature does not match its content (key {signed_by}): it "
            "was modified after it was signed"
        )
    return f"verified (key {signed_by})"


def write_signed(path: str | os.PathLike[str], data: bytes, keys: Keys) -> None:
    """Write ``data`` to ``path``, signed when a key is set (a file the library reads back later:
    a background compile's hand-off).

    Example:
        >>> write_signed(tmp / "job.json", b"{}", resolve_keys(None,  # doctest: +SKIP
        ...     caller="background"))
    """
    Path(path).write_bytes(sign(data, keys.signing) if keys.signing is not None else data)


def read_signed(path: str | os.PathLike[str], keys: Keys) -> bytes:
    """The content of a file :func:`write_signed` wrote, its signature checked when a key is set.

    Raises:
        SignatureRefused: a key is set and the file is unsigned, signed with another key or changed.
        OSError: the file cannot be read.
    """
    data, trailer = split(Path(path).read_bytes())
    check(data, trailer, keys)
    return data
