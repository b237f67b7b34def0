"""The environment header of a compile-cache artifact, and the check that refuses a mismatch.

torch's cache keys hold no CPU instruction-set information: an AVX-512 cache reused under
``ATEN_CPU_CAPABILITY=avx2`` gave cache hits and a NaN loss (measured, torch 2.13). So a load
compares the builder's environment field by field before a byte reaches inductor. The CPU fields
are compared only for an artifact that holds CPU kernels; on a GPU the current device's identity
is what inductor's keys and kernels depend on (its name, CUDA and Triton, as
``CacheBase.get_system()``, plus capability and SM count, which each Triton kernel's metadata
holds).
"""

from __future__ import annotations

import functools
import importlib.metadata
import os
import platform
import sys
from dataclasses import dataclass
from typing import Any

import torch

from .. import _dynamo

__all__ = [
    "CPU_FIELDS",
    "FORMAT_VERSION",
    "HeaderMismatch",
    "compare_environment",
    "current_environment",
]

FORMAT_VERSION = 2
"""Bumped whenever the archive layout changes; an artifact of another version is refused.
2 (2026-11): the current GPU's identity instead of every visible GPU's name."""

CPU_FIELDS = ("cpu_isa", "aten_cpu_capability", "num_threads")
"""Compared only for an artifact with CPU kernels (``.so``) or saved where no GPU was visible:
what C++ kernels are built for (inductor keys a graph on the thread count only when it may emit
C++ code, ``FxGraphHashDetails``), and what torchrun changes (``OMP_NUM_THREADS=1``)."""

RECORDED_ONLY = ("driver",)
"""Recorded for the reader, never refused: a newer driver runs what an older one built."""

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


def _gpu(device_type: str) -> dict[str, Any] | None:
    """The current device's identity (not every visible GPU's: a job saved on 8 GPUs and loaded
    under ``CUDA_VISIBLE_DEVICES=0`` runs the same kernels)."""
    if device_type not in ("cuda", "hip"):
        return None
    properties = torch.cuda.get_device_properties(torch.cuda.current_device())
    name = (
        properties.name
        if device_type == "cuda"
        else getattr(properties, "gcnArchName", properties.name)
    )
    return {
        "name": name,
        "capability": [properties.major, properties.minor],
        "sm_count": properties.multi_processor_count,
    }


@functools.cache  # asked at every save, load and bench result; it cannot change in a process
def _driver(device_type: str) -> str | None:
    """The NVIDIA driver's version through NVML (``nvidia-ml-py``, installed with CUDA torch
    wheels' dependencies on most machines), or ``None``."""
    if device_type != "cuda":
        return None
    try:
        import pynvml

        pynvml.nvmlInit()
        version = pynvml.nvmlSystemGetDriverVersion()
        return version.decode() if isinstance(version, bytes) else str(version)
    except Exception:  # noqa: BLE001 - recorded only: a missing NVML is not a reason to fail
        return None


def current_environment() -> dict[str, Any]:
    """What a compiled kernel of this process depends on, as a JSON-able dict: format, torch (and
    its git hash), Python, system, device, CUDA/HIP, the current GPU (name, capability, SM count)
    and its driver, Triton, the CPU ISA and its override, and the thread count (docs/cache.md
    lists why each is there).

    Example:
        >>> current_environment()["device_type"]  # doctest: +SKIP
        'cpu'
    """
    device_type = _device_type()
    return {
        "format_version": FORMAT_VERSION,
        "torch": torch.__version__,
        "torch_git": getattr(torch.version, "git_version", None),
        "python": f"{sys.version_info.major}.{sys.version_info.minor}",
        "system": platform.system(),
        "machine": platform.machine(),
        "device_type": device_type,
        "cuda": torch.version.cuda,
        "hip": torch.version.hip,
        "gpu": _gpu(device_type),
        "driver": _driver(device_type),
        "triton": _triton_version(),
        "cpu_isa": _dynamo.cpu_capability(),
        "aten_cpu_capability": os.environ.get("ATEN_CPU_CAPABILITY"),
        "num_threads": torch.get_num_threads(),
    }


def compare_environment(
    saved: dict[str, Any], current: dict[str, Any] | None = None, *, cpu_kernels: bool = True
) -> list[HeaderMismatch]:
    """Every field in which ``saved`` differs from ``current`` (this process by default); a field
    missing on either side is a mismatch, so a newer format is refused rather than half-trusted.

    Args:
        saved: the artifact's header environment.
        current: the environment to compare with; ``None``: :func:`current_environment`.
        cpu_kernels: whether the artifact holds CPU kernels; without them (a GPU job's artifact)
            the CPU fields are not compared (:data:`CPU_FIELDS`), unless it was saved where no
            GPU was visible.

    Example:
        >>> env = current_environment()
        >>> compare_environment(env, env)  # doctest: +NORMALIZE_WHITESPACE
        []
    """
    current = current_environment() if current is None else current
    skip = set(RECORDED_ONLY)
    if not cpu_kernels and saved.get("device_type") not in (None, "cpu"):
        skip.update(CPU_FIELDS)
    fields = [
        name for name in [*current, *(n for n in saved if n not in current)] if name not in skip
    ]
    # JSON turns tuples into lists; compare through the same round trip.
    return [
        HeaderMismatch(field=name, saved=saved.get(name), current=current.get(name))
        for name in fields
        if _jsonable(saved.get(name)) != _jsonable(current.get(name))
    ]


def _jsonable(value: Any) -> Any:
    return list(value) if isinstance(value, tuple) else value
