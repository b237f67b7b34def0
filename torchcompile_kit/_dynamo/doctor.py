"""What the doctor sets and reads that torch keeps private: inductor's debugging settings and the
backends of the ablation ladder.

Part of the one door to torch's private compiler APIs (see ``_dynamo/__init__.py``)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping
from typing import Any

__all__ = [
    "DEBUG_SETTINGS",
    "autotune_afresh",
    "compiler_bisect",
    "inductor_settings",
    "ladder_backends",
    "missing_settings",
    "preload_compiler",
]

DEBUG_SETTINGS: dict[str, dict[str, Any]] = {
    "fallback_random": {"fallback_random": True},
    "emulate_precision_casts": {"emulate_precision_casts": True},
    "vectorisation off (cpp.simdlen=1)": {"cpp.simdlen": 1},
    "layout_optimization off": {"layout_optimization": False},
}
"""Inductor settings that hide a class of problem when turned as shown (the doctor tries each on
the first bad rung): random ops run as eager's, low-precision casts rounded as eager does, scalar
instead of vectorised CPU code, no layout changes."""


def ladder_backends() -> list[str]:
    """The debugging backends of the ablation ladder this torch has, in order: ``eager`` (dynamo
    only), ``aot_eager`` (+ AOTAutograd), ``aot_eager_decomp_partition`` (+ decompositions and the
    partitioner).

    Why: ``aot_eager_decomp_partition`` is debug-tagged, so ``torch.compiler.list_backends()``
    hides it although ``torch.compile`` takes it by name; dynamo's registry lists it. Upstream:
    ``torch._dynamo.list_backends(exclude_tags=())``
    (https://github.com/pytorch/pytorch/blob/main/torch/_dynamo/backends/registry.py). Can go when
    a public call lists debug backends.
    """
    import torch._dynamo

    known = set(torch._dynamo.list_backends(exclude_tags=()))
    return [name for name in ("eager", "aot_eager", "aot_eager_decomp_partition") if name in known]


def preload_compiler() -> None:
    """Import dynamo and inductor's compiler (and with them its code generation), as the first
    ``torch.compile`` would.

    Why: the doctor's trial starter imports them once and forks each trial from there (about 9 s
    of imports per trial on a 2-core CPU); no public call loads the compiler ahead of the first
    compile. Upstream: ``torch/_inductor/compile_fx.py``
    (https://github.com/pytorch/pytorch/blob/main/torch/_inductor/compile_fx.py). Can go when
    torch has a public warm-up of its compiler.
    """
    import torch._dynamo
    import torch._inductor.compile_fx  # noqa: F401


def missing_settings(settings: Mapping[str, Any]) -> list[str]:
    """The inductor settings of ``settings`` this torch does not have (dotted names)."""
    from torch._inductor import config

    missing = []
    for name in settings:
        owner: Any = config
        *parents, leaf = name.split(".")
        for part in parents:
            owner = getattr(owner, part, None)
        if owner is None or not hasattr(owner, leaf):
            missing.append(name)
    return missing


def autotune_afresh() -> None:
    """Inductor's local autotuning cache off in this process (the doctor's trial starter, whose
    forks inherit it): each trial benchmarks its kernels' configurations itself, so a trial run
    twice ("is it deterministic?") does not reuse the first one's picks.

    Why: ``autotune_local_cache`` has no environment variable, unlike the graph caches
    (``TORCHINDUCTOR_FX_GRAPH_CACHE``, ``TORCHINDUCTOR_AUTOGRAD_CACHE``). Upstream:
    ``torch._inductor.config.autotune_local_cache``
    (https://github.com/pytorch/pytorch/blob/main/torch/_inductor/config.py). Can go when torch
    reads it from the environment.
    """
    from torch._inductor import config

    config.autotune_local_cache = False


@contextlib.contextmanager
def inductor_settings(settings: Mapping[str, Any]) -> Iterator[None]:
    """Inductor's config patched with ``settings`` (dotted names) while the block runs.

    Why: the doctor's trials ask which setting hides a problem (``fallback_random``,
    ``emulate_precision_casts``, ``cpp.simdlen``, ``layout_optimization``): private config with
    no public switch. Upstream: ``torch._inductor.config.patch``
    (https://github.com/pytorch/pytorch/blob/main/torch/_inductor/config.py). Can go when torch
    has public debugging switches.
    """
    if not settings:
        yield
        return
    from torch._inductor import config

    with config.patch(dict(settings)):
        yield


def compiler_bisect(good: Any) -> dict[str, Any] | None:
    """torch's pass-level bisection of ``good`` (a callable returning ``True`` when the compiled
    run is right, ``False`` when not; it must build its ``torch.compile`` wrappers on every call):
    the first backend of torch's ladder that fails and, within it, the subsystem (decompositions,
    pre/joint/post-grad passes, lowerings, inductor settings) and the application number whose
    turning off hides it. ``None`` when every backend passed; ``{"error": ...}`` when the
    bisection could not finish (a flaky ``good``) or this torch has no bisector.

    Why: the only pass-level localisation torch has, private and undocumented
    (``torch._inductor.compiler_bisector.CompilerBisector.do_bisect``, since PR #131936,
    https://github.com/pytorch/pytorch/blob/main/torch/_inductor/compiler_bisector.py); it reads
    the override when ``torch.compile`` is called, so callers rebuild their wrappers. Can go when
    torch has a public bisection entry point.

    Example:
        >>> compiler_bisect(lambda: True) is None  # doctest: +SKIP
        True
    """
    try:
        from torch._inductor.compiler_bisector import CompilerBisector
    except ImportError:
        return {"error": "this torch has no torch._inductor.compiler_bisector"}
    try:
        result = CompilerBisector.do_bisect(good)
    except Exception as err:  # noqa: BLE001 - a flaky run or an internal assertion: a finding
        return {"error": f"{type(err).__name__}: {str(err)[:300]}"}
    if result is None:
        return None
    return {
        "backend": result.backend,
        "subsystem": result.subsystem,
        "bisect_number": result.bisect_number,
        "debug_info": result.debug_info,
    }
