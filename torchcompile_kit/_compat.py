"""Version helpers for torch and the optional libraries (probes of private names live in
``_dynamo``); versions are compared only for rules documented by version.
"""

from __future__ import annotations

import functools
import importlib.metadata
import importlib.util

from packaging.version import InvalidVersion, Version

__all__ = ["is_package_available", "package_version", "version_at_least"]


@functools.cache
def is_package_available(name: str) -> bool:
    """Whether ``name`` can be imported, without importing it (cached ``find_spec``)."""
    return importlib.util.find_spec(name) is not None


@functools.cache
def package_version(name: str) -> Version | None:
    """The installed version of distribution ``name`` as its *release* (nightlies count as it).

    ``2.13.0.dev20260101+cu128`` and ``2.13.0+cpu`` both become ``Version("2.13.0")``, so a
    nightly of a release satisfies ``>= release``. Returns ``None`` when not installed.
    """
    try:
        raw = importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None
    try:
        release = Version(raw).release
    except InvalidVersion:
        return None
    return Version(".".join(str(part) for part in release))


def version_at_least(name: str, minimum: str, *, installed: str | Version | None = None) -> bool:
    """Whether ``name`` is installed (or, with ``installed``, declared) at ``minimum`` or later."""
    if installed is None:
        current = package_version(name)
    else:
        current = Version(".".join(str(p) for p in Version(str(installed)).release))
    return current is not None and current >= Version(minimum)
