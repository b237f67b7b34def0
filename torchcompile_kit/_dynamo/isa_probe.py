"""Inductor's CPU vector-ISA probe, started early by a cache load.

Part of the one door to torch's private compiler APIs (see ``_dynamo/__init__.py``)."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Any

logger = logging.getLogger(__name__)

__all__ = [
    "cpu_isa_probe_stats",
    "probed_cpu_isas",
    "start_cpu_isa_probe",
    "wait_for_cpu_isa_probe",
]


# --- inductor's CPU vector-ISA probe ----------------------------------------------------------
# Before inductor loads or builds its first CPU kernel in a process it picks the vector ISA, and it
# verifies each candidate the CPU flags allow by building a test library and dlopen-ing it in a
# child Python (`torch._inductor.cpu_vec_isa.valid_vec_isa_list`, functools.cache'd per process;
# https://github.com/pytorch/pytorch/blob/main/torch/_inductor/cpu_vec_isa.py). Measured on the
# 12-layer GPT-2 warm start (torch 2.13, 2-core CPU): ~2 s of a ~7 s first step, spent waiting on
# ten child Pythons. The wait is the children's, not ours, so it can run beside the model build
# that comes before the first compile. Can go when inductor caches the probe across processes or
# makes it cheap.
# A process that knows another process's answer on this machine (a compile cache's saver, a
# background compile's worker) skips the builds: for the length of the probe, inductor's own
# `config.cpp.vec_isa_ok=True` answers each ISA's base check and every other test build (AVX-512
# BF16, VNNI, AMX) is taken as passing; the answer is kept only if it is exactly the known one, ISA
# names and compiler flags alike (a check that failed there shows as a missing ISA or flag), else
# every ISA object's cached answer is forgotten and inductor checks for itself
# (https://github.com/pytorch/pytorch/blob/main/torch/_inductor/config.py, vec_isa_ok).

_isa_probe_lock = threading.Lock()
_isa_probe: threading.Thread | None = None


def _isa_probe_fn() -> Callable[[], Any]:
    """inductor's cached probe function (``functools.cache``: ``cache_info`` counts its runs)."""
    from torch._inductor.cpu_vec_isa import valid_vec_isa_list

    return valid_vec_isa_list


def probed_cpu_isas(*, run: bool = True) -> list[list[str]] | None:
    """The vector ISAs inductor's probe finds valid in this process with their compiler flags,
    e.g. ``[["avx512", "-mavx512f ..."], ["avx2", "-mavx2 ..."]]``: what
    :func:`start_cpu_isa_probe` takes as ``known``. It runs the probe if it has not run, or with
    ``run=False`` returns ``None`` then."""
    probe = _isa_probe_fn()
    if not run and not probe.cache_info().currsize:
        return None
    return _answer(probe())


def _answer(isas: list[Any]) -> list[list[str]]:
    return [[str(isa), isa.build_arch_flags()] for isa in isas]


def start_cpu_isa_probe(known: list[list[str]] | None = None) -> threading.Thread | None:
    """Run inductor's once-per-process CPU vector-ISA probe now, on a background thread.
    ``known``: another process's :func:`probed_cpu_isas` on this machine (a compile cache carries
    its saver's); when this CPU's flags give exactly that answer, no test library is built.

    It calls the very function inductor calls at its first CPU kernel, earlier, so inductor finds
    the answer cached; no setting changes outside the probe. The probe must not run twice at once
    (inductor's ISA objects edit their own compiler flags while they check them), so every dynamo
    compile first waits for a running probe: a start-of-compile callback
    (``torch._dynamo.callback.CompilationCallbackHandler``, registered once per process and a
    no-op once the probe is done). The probe therefore overlaps what runs before the first
    compile (building the model, the data), not the compile itself.

    Returns the thread, or ``None`` when the probe is already done or running.
    """
    global _isa_probe
    probe = _isa_probe_fn()
    if probe.cache_info().currsize:
        return None
    # The probe imports these lazily; import them here so no import runs on the thread.
    import torch._inductor.codecache
    import torch._inductor.cpp_builder  # noqa: F401
    from torch._dynamo.callback import callback_handler

    with _isa_probe_lock:
        if _isa_probe is not None and _isa_probe.is_alive():
            return None

        def run() -> None:
            try:
                if known is None or not _probe_as_known(probe, known):
                    probe()
            except Exception:
                logger.debug(
                    "background CPU ISA probe failed; inductor will probe itself", exc_info=True
                )

        # registered once; again if something cleared dynamo's callbacks since
        if _wait_before_compiling not in callback_handler.start_callbacks:
            callback_handler.register_start_callback(_wait_before_compiling)
        _isa_probe = threading.Thread(target=run, name="tck-cpu-isa-probe", daemon=True)
        _isa_probe.start()
        return _isa_probe


def _probe_as_known(probe: Callable[[], Any], known: list[list[str]]) -> bool:
    """Fill inductor's probe cache with ``known`` if this CPU's flags give exactly that answer."""
    from torch._inductor import config, cpu_vec_isa

    real_check_build = cpu_vec_isa.VecISA.check_build
    cpu_vec_isa.VecISA.check_build = lambda self, code: True  # type: ignore[method-assign]
    try:
        with config.patch({"cpp.vec_isa_ok": True}):
            if _answer(probe.__wrapped__()) == known:  # type: ignore[attr-defined]
                probe()  # cached for the process: the same ISA objects, the same answers
                return True
    finally:
        cpu_vec_isa.VecISA.check_build = real_check_build  # type: ignore[method-assign]
    # forget what was answered under the stand-ins: each ISA class's cached checks, and the
    # sub-feature flags its checks set on the shared ISA objects
    for isa_class in vars(cpu_vec_isa).values():
        if isinstance(isa_class, type) and issubclass(isa_class, cpu_vec_isa.VecISA):
            for member in vars(isa_class).values():
                if hasattr(member, "cache_clear"):
                    member.cache_clear()
    for isa in cpu_vec_isa.supported_vec_isa_list:
        for name in [
            name for name in vars(isa) if name.startswith("_is_") and name.endswith("_supported")
        ]:
            delattr(isa, name)
    return False


def _wait_before_compiling(_args: Any) -> None:
    """dynamo start-of-compile callback: let a running background ISA probe finish first."""
    wait_for_cpu_isa_probe()


def wait_for_cpu_isa_probe(timeout: float | None = None) -> bool:
    """Wait for a background probe started by :func:`start_cpu_isa_probe`; whether
    none is running."""
    thread = _isa_probe
    if thread is not None:
        thread.join(timeout)
        return not thread.is_alive()
    return True


def cpu_isa_probe_stats() -> dict[str, int]:
    """How often inductor's ISA probe ran (``misses``) and was answered from its cache
    (``hits``)."""
    info = _isa_probe_fn().cache_info()
    return {"hits": int(info.hits), "misses": int(info.misses)}
