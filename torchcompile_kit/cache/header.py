"""The environment header of a compile-cache artifact, and the check that refuses a mismatch.

torch's cache keys hold no CPU instruction-set information: an AVX-512 cache reused under
``ATEN_CPU_CAPABILITY=avx2`` gave cache hits and a NaN loss (measured, torch 2.13). So a load
compares the builder's environment field by field before a byte reaches inductor.
"""

from __future__ import annotations

import importlib.metadata
import os
import platform
import sys
from dataclasses import dataclass
from typing import Any

import torch

from .. import _dynamo

__all__ = ["FORMAT_VERSION", "HeaderMismatch", "compare_environment", "current_environment"]

FORMAT_VERSION = 1
"""Bumped whenever the archive layout changes; an artifact of another version is refused."""

# Distribution names under which Triton ships (upstream wheel, ROCm wheel).
_TRITON_DISTRIBUTIONS = ("triton", "pytorch-triton-rocm", "pytorch-triton")


@dataclass(kw_only=True, slots=True, frozen=True)
class HeaderMismatch:
    """One environment field that differs between an artifact and the running process."""

    field: str
    """The header field (``"torch"``, ``"cpu_isa"``, ``"num_threads"``, ...)."""
    saved: Any
    """Its value in the artifact."""
    current: Any
    """Its value in this process."""

    def __str__(self) -> str:
        return f"{self.field}: saved {self.saved!r}, this process {self.current!r}"


def _triton_version() -> str | None:
    for name in _TRITON_DISTRIBUTIONS:
        try:
            return importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            continue
    return None


def _device_type() -> str:
    # A CPU build never initialises CUDA here; a CUDA/HIP build asks the driver for a count only.
    if torch.version.hip is not None and torch.cuda.is_available():
        return "hip"
    if torch.cuda.is_available():
        return "cuda"
    return "cpu"


def _gpu_names(device_type: str) -> list[str]:
    if device_type not in ("cuda", "hip"):
        return []
    return [torch.cuda.get_device_name(index) for index in range(torch.cuda.device_count())]


def current_environment() -> dict[str, Any]:
    """What a compiled kernel of this process depends on, as a JSON-able dict: format, torch (and
    its git hash), Python, system, device, CUDA/HIP and GPU names, Triton, the CPU ISA and its
    override, and the thread count (docs/cache.md lists why each is there).

    Example:
        >>> current_environment()["device_type"]  # doctest: +SKIP
        'cpu'
    """
    device_type = _device_type()
    return {"format_version": FORMAT_VERSION, "torch": torch.__version__,
            "torch_git": getattr(torch.version, "git_version", None),
            "python": f"{sys.version_info.major}.{sys.version_info.minor}",
            "system": platform.system(), "machine": platform.machine(), "device_type": device_type,
            "cuda": torch.version.cuda, "hip": torch.version.hip,
            "gpu_names": _gpu_names(device_type), "triton": _triton_version(),
            "cpu_isa": _dynamo.cpu_capability(),
            "aten_cpu_capability": os.environ.get("ATEN_CPU_CAPABILITY"),
            "num_threads": torch.get_num_threads()}


def compare_environment(saved: dict[str, Any],
                        current: dict[str, Any] | None = None) -> list[HeaderMismatch]:
    """Every field in which ``saved`` differs from ``current`` (this process by default); a field
    missing on either side is a mismatch, so a newer format is refused rather than half-trusted.

    Example:
        >>> env = current_environment()
        >>> compare_environment(env, env)
        []
    """
    current = current_environment() if current is None else current
    fields = list(current) + [name for name in saved if name not in current]
    # JSON turns tuples into lists; compare through the same round trip.
    return [HeaderMismatch(field=name, saved=saved.get(name), current=current.get(name))
            for name in fields if _jsonable(saved.get(name)) != _jsonable(current.get(name))]


def _jsonable(value: Any) -> Any:
    return list(value) if isinstance(value, tuple) else value
