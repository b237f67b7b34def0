"""``save_compile_cache`` / ``load_compile_cache``: one artifact in, one out, never wrong (a load
that goes wrong is a ``CompileCacheWarning`` and a falsy result; in a distributed job each rank
writes and reads an artifact of its own, :func:`rank_path`).
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import warnings
from dataclasses import dataclass, field
from typing import Any

from .. import _dynamo
from ..errors import CompileCacheWarning
from . import signature, storage
from .artifact import (
    ArtifactRefused,
    ArtifactUnreadable,
    collect_kernel_files,
    install_kernel_files,
    pack,
    unpack,
)
from .header import HeaderMismatch, current_environment
from .signature import KeyArg, Keys, SignatureRefused, resolve_keys

__all__ = [
    "CacheLoadResult",
    "CacheSaveResult",
    "CompileCacheWarning",
    "load_compile_cache",
    "rank_path",
    "save_compile_cache",
]

logger = logging.getLogger(__name__)

LARGE_KERNEL_BYTES = 256 * 2**20
"""Above this many bytes of kernels, a save warns that the inductor dir holds more than this job."""


@dataclass(kw_only=True, slots=True)
class CacheLoadResult:
    """What :func:`load_compile_cache` did; truthy only when something was loaded."""

    path: str
    """Where the artifact was looked for."""
    loaded: bool
    """Whether the artifact's compiled graphs and kernels were made available to inductor."""
    reason: str = ""
    """Why nothing was loaded (``""`` when ``loaded``)."""
    mismatches: list[HeaderMismatch] = field(default_factory=list)
    """The environment fields that differ, when the artifact was refused for them."""
    mega_cache_entries: dict[str, int] = field(default_factory=dict)
    """Mega-cache entries loaded, by kind (``{"inductor": 4, "aot_autograd": 2}``)."""
    kernel_files: int = 0
    """Compiled-kernel files placed into the inductor cache dir (files already there excluded)."""
    artifact_bytes: int = 0
    """Size of the artifact read."""
    signature: str = ""
    """``"verified (key <id>)"``, ``"unsigned"`` (no key set), ``"signed by key <id>, not checked
    (no key set)"``, or why it was refused (``reason`` then says so too)."""
    inductor_cache_dir: str = ""
    """The inductor cache dir the kernels went to."""
    precompiled_regions: list[str] = field(default_factory=list)
    """Regions whose dynamo entries it carries (``precompile=True``): each runs without a trace
    when compiled again with the same fingerprint (:meth:`region_paths` says whether it did)."""
    cpu_isa_probe_started: bool = False
    """Whether the load started inductor's CPU vector-ISA probe on a background thread.

    Done when the artifact holds CPU kernels (``.so``): inductor checks the ISA once per process
    before its first CPU kernel, ~2 s of child processes that can run beside the model build
    instead of inside the first step; the first compile waits for it (docs/cache.md)."""
    counters_at_load: dict[str, int] = field(default_factory=dict, repr=False)
    """torch's cache counters right after the load; :meth:`cache_stats` subtracts them."""

    def __bool__(self) -> bool:
        return self.loaded

    def cache_stats(self) -> dict[str, int]:
        """FX-graph and AOTAutograd cache hits/misses since this load; call it after the first step
        (a load only places files). ``torch._dynamo.reset()`` restarts the counters.

        Example:
            >>> train_step(batch); result.cache_stats()["fxgraph_cache_hit"]  # doctest: +SKIP
            4
        """
        now = _dynamo.compile_cache_counters()
        before = self.counters_at_load
        return {k: v - before.get(k, 0) if v >= before.get(k, 0) else v for k, v in now.items()}

    def region_paths(self) -> dict[str, str]:
        """How each precompiled region of this process compiled, by label: ``"precompiled (no
        trace)"``, ``"traced again: ..."`` (why its entry was not used), ``"traced (saved for the
        next restart)"``, or ``"not run yet"`` for a region the artifact carries that has not run.
        Call it after the first step; ``cache_stats()`` has torch's counters.

        Example:
            >>> train_step(batch); result.region_paths()  # doctest: +NORMALIZE_WHITESPACE, +SKIP
            {'GPT2Block': 'precompiled (no trace)', 'loss_ForCausalLMLoss': 'precompiled (no
            trace)'}
        """
        paths = {record["label"]: "not run yet" for record in _dynamo.loaded_regions()}
        paths.update({record["label"]: record["path"] for record in _dynamo.precompiled_regions()})
        return paths

    def summary(self) -> str:
        """One line: what was loaded from where, or why not."""
        if not self.loaded:
            return f"compile cache {self.path!r} not loaded: {self.reason}"
        entries = ", ".join(f"{n} {kind}" for kind, n in sorted(self.mega_cache_entries.items()))
        return (
            f"compile cache {self.path!r} loaded: {entries or 'no'} mega-cache entries, "
            f"{self.kernel_files} kernel files into {self.inductor_cache_dir}"
        )

    def as_dict(self) -> dict[str, Any]:
        """The result as JSON-able data (for a benchmark record or a training log)."""
        data = {name: getattr(self, name) for name in self.__slots__ if name != "counters_at_load"}
        data["mismatches"] = [str(m) for m in self.mismatches]
        return data


@dataclass(kw_only=True, slots=True)
class CacheSaveResult:
    """What :func:`save_compile_cache` did; truthy when the artifact at ``path`` is up to date."""

    path: str
    """Where the artifact was (or would have been) written."""
    saved: bool
    """Whether this call left a current artifact at ``path`` (written, or unchanged)."""
    reason: str = ""
    """Why nothing was written (another rank writes, nothing compiled, unchanged, error)."""
    mega_cache_entries: dict[str, int] = field(default_factory=dict)
    """Mega-cache entries saved, by kind."""
    kernel_files: int = 0
    """Compiled-kernel files bundled."""
    artifact_bytes: int = 0
    """Size of the artifact written."""
    digest: str = ""
    """sha256 of the artifact bytes (identical compiles give identical artifacts)."""
    signed_by: str = ""
    """The id of the key that signed it (``""``: unsigned, no key set)."""

    def __bool__(self) -> bool:
        return self.saved

    def as_dict(self) -> dict[str, Any]:
        """The result as JSON-able data (for a benchmark record or a training log)."""
        return {name: getattr(self, name) for name in self.__slots__}


def _rank() -> int | None:
    """This process's rank when ``torch.distributed`` is initialised, else ``None``."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        return dist.get_rank()
    return None


def rank_path(target: str) -> str:
    """The artifact of this process's rank: ``target`` itself on rank 0 and outside a distributed
    job, ``<name>.rank<r><suffix>`` beside it on rank ``r`` (``cc.tck`` -> ``cc.rank1.tck``).

    Inductor's cache keys hold the device index (``cuda:1`` is not ``cuda:0``: pytorch#108971), so
    rank 0's graphs miss on every other GPU, and dynamo's precompiled entries guard tensor devices
    too; vLLM keeps one cache folder per rank for the same reason. Rank 0 keeps the plain path, so a
    single-process restart (on ``cuda:0``) reads its artifact. The rank is ``torch.distributed``'s,
    or before the process group exists the launcher's ``RANK`` (with ``WORLD_SIZE`` above 1).

    Example:
        >>> rank_path("ckpt/cc.tck")  # outside a distributed job
        'ckpt/cc.tck'
    """
    rank = _artifact_rank()
    if not rank:
        return target
    folder, slash, name = target.rpartition("/")
    stem, dot, suffix = name.rpartition(".")
    name = f"{stem}.rank{rank}.{suffix}" if dot and stem else f"{name}.rank{rank}"
    return f"{folder}{slash}{name}"


def _artifact_rank() -> int:
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        return dist.get_rank()
    if int(os.environ.get("WORLD_SIZE", "1") or 1) > 1:
        return int(os.environ.get("RANK", "0") or 0)
    return 0


def save_compile_cache(
    path: str | os.PathLike[str], *, barrier: bool = True, key: KeyArg = None
) -> CacheSaveResult:
    """Save everything inductor compiled (or loaded) in this process to ``path``, atomically.

    The mega-cache and every kernel of the inductor cache dir (point ``TORCHINDUCTOR_CACHE_DIR`` at
    a per-job folder to keep it small), under an environment header and a content hash; with a key,
    signed (HMAC-SHA256), so a load with the key refuses an artifact anyone else wrote. In a
    distributed job every rank calls it and writes an artifact of its own (:func:`rank_path`:
    inductor's keys hold the device index), and a barrier follows.

    Args:
        path: a local file path or fsspec URL; a folder (existing, or ending in ``/``) gets
            ``compile-cache.tck`` inside it.
        barrier: in a distributed job, wait for every rank's write before returning.
        key: sign with this key (a string or bytes; a list: the first signs). ``None``: the key in
            ``$TORCHCOMPILE_KIT_CACHE_KEY``, if set, else unsigned (docs/cache.md, "Security").

    Returns:
        A :class:`CacheSaveResult`, falsy when nothing was written (and why); ``signed_by`` names
        the key's id.

    Raises:
        ImportError: ``path`` is a URL and fsspec is not installed.
        TypeError: ``key`` is not a string, bytes or a list of them.

    Example:
        >>> save_compile_cache("s3://bucket/run-7/compile-cache.tck")  # doctest: +SKIP
        CacheSaveResult(path='s3://bucket/run-7/compile-cache.tck', saved=True, ...)
        >>> save_compile_cache("ckpt/cc.tck", key=os.environ["MY_TEAM_KEY"])  # doctest: +SKIP
    """
    storage.resolve_path(path, caller="save_compile_cache")  # a wrong path is refused by its name
    keys = resolve_keys(key, caller="save_compile_cache")
    return save_if_changed(path, barrier=barrier, unchanged_digest="", keys=keys)


def save_if_changed(
    path: str | os.PathLike[str], *, barrier: bool, unchanged_digest: str, keys: Keys
) -> CacheSaveResult:
    """:func:`save_compile_cache`, skipping the write when the artifact's sha256 would be
    ``unchanged_digest`` (nothing new compiled since the last save of ``compile_cache``)."""
    target = rank_path(storage.resolve_path(path))
    storage.check_storage(target)  # on every rank, so a missing fsspec fails everywhere alike
    rank = _rank()
    try:
        return _write_artifact(target, unchanged_digest, keys)
    finally:
        if rank is not None and barrier:
            import torch.distributed as dist

            dist.barrier()


def _write_artifact(target: str, unchanged_digest: str, keys: Keys) -> CacheSaveResult:
    regions = _dynamo.precompiled_regions()
    # dynamo's entries of the precompiled regions join the mega-cache
    with _dynamo.precompiling() if regions else contextlib.nullcontext():
        mega = _dynamo.save_mega_cache()
    if mega is None:
        reason = (
            "nothing was compiled with inductor in this process "
            "(torch.compiler.save_cache_artifacts returned None)"
        )
        return CacheSaveResult(path=target, saved=False, reason=reason)
    mega_bytes, entries = mega
    cache_dir = _dynamo.inductor_cache_dir()
    kernels = collect_kernel_files(cache_dir)
    kernel_bytes = sum(len(f.data) for f in kernels)
    if kernel_bytes > LARGE_KERNEL_BYTES:
        warnings.warn(
            f"the compile cache bundles every compiled kernel in {cache_dir!r}: "
            f"{kernel_bytes / 2**20:.0f} MiB, other runs' kernels included; point "
            "TORCHINDUCTOR_CACHE_DIR at a folder of this job's own to keep it small.",
            CompileCacheWarning,
            stacklevel=4,
        )
    contents = {
        "mega_cache_entries": entries,
        "mega_cache_bytes": len(mega_bytes),
        "kernel_files": len(kernels),
        "kernel_bytes": kernel_bytes,
        "precompiled_regions": regions,
        # C++ kernels: the CPU fields of the header are compared on load only then
        "cpu_kernels": any(kernel.name.endswith(".so") for kernel in kernels),
        # inductor's CPU-ISA answer on the saving machine: a load on one whose CPU's flags admit
        # the same ISAs skips building their test libraries (see _dynamo/isa_probe.py)
        "cpu_vec_isas": _dynamo.probed_cpu_isas(run=False),
    }
    data = pack(
        environment=current_environment(),
        mega_cache=mega_bytes,
        kernel_files=kernels,
        contents=contents,
    )
    if keys.signing is not None:
        data = signature.sign(data, keys.signing)
    digest = hashlib.sha256(data).hexdigest()
    result = CacheSaveResult(
        path=target,
        saved=True,
        mega_cache_entries=entries,
        kernel_files=len(kernels),
        artifact_bytes=len(data),
        digest=digest,
        signed_by=signature.key_id(keys.signing) if keys.signing else "",
    )
    if digest == unchanged_digest:
        result.reason = "unchanged since the last save; not rewritten"
        return result
    try:
        storage.write_bytes(target, data)
    except storage.ConcurrentSaveError as err:
        result.saved = False
        result.reason = f"another job's artifact is kept: {err}"
        warnings.warn(f"compile cache not saved: {err}", CompileCacheWarning, stacklevel=3)
        return result
    except Exception as err:  # noqa: BLE001 - a failed save costs the next run a cold compile, not this run
        result.saved = False
        result.reason = f"write failed: {type(err).__name__}: {err}"
        warnings.warn(
            f"compile cache not saved to {target!r}: {result.reason}; the previous "
            "artifact (if any) is unchanged.",
            CompileCacheWarning,
            stacklevel=3,
        )
        return result
    logger.info(
        "compile cache saved to %r: %s, %d kernel files, %d bytes",
        target,
        entries,
        len(kernels),
        len(data),
    )
    return result


def load_compile_cache(path: str | os.PathLike[str], *, key: KeyArg = None) -> CacheLoadResult:
    """Load a compile cache saved by :func:`save_compile_cache`, if it is whole and fits.

    Call it in a fresh process before the first compiled step (and before building the model: the
    CPU ISA probe then runs beside the build). In a distributed job each rank loads its own
    artifact (:func:`rank_path`). With a key, the signature is checked first, on the
    raw bytes: an artifact that is unsigned, signed with another key or changed after signing is
    refused before anything in it is parsed, written or loaded. Then the hash and environment
    header are checked, the kernels installed into the inductor cache dir and the mega-cache
    hot-loaded. It holds pickles and shared libraries: without a key, load only from storage only
    you can write (docs/cache.md, "Security").

    Args:
        path: a local file path or an fsspec URL, as given to :func:`save_compile_cache`.
        key: the key it must be signed with (a list: any of them). ``None``: the key in
            ``$TORCHCOMPILE_KIT_CACHE_KEY``, if set, else nothing is checked.

    Returns:
        A :class:`CacheLoadResult`, truthy only when something was loaded (``reason`` and
        ``mismatches`` say why not; ``signature`` what was checked). An absent artifact is silent; a
        corrupt, mismatched or refused one also emits a :class:`CompileCacheWarning`, and so does a
        signed one loaded without a key (its signature was not checked).

    Raises:
        ImportError: ``path`` is a URL and fsspec is not installed.
        TypeError: ``key`` is not a string, bytes or a list of them.

    Example:
        >>> result = load_compile_cache("s3://bucket/run-7/compile-cache.tck")  # doctest: +SKIP
        >>> print(result.summary(), result.signature)  # doctest: +SKIP
    """
    storage.resolve_path(path, caller="load_compile_cache")  # a wrong path is refused by its name
    return load_with_keys(path, resolve_keys(key, caller="load_compile_cache"))


def load_with_keys(
    path: str | os.PathLike[str], keys: Keys, *, per_rank: bool = True
) -> CacheLoadResult:
    """:func:`load_compile_cache` with its keys resolved (``compile_cache``'s own);
    ``per_rank=False`` reads ``path`` itself on every rank (a background worker's artifact, compiled
    for rank 0)."""
    target = storage.resolve_path(path)
    target = rank_path(target) if per_rank else target
    cache_dir = _dynamo.inductor_cache_dir()
    result = CacheLoadResult(path=target, loaded=False, inductor_cache_dir=cache_dir)
    try:
        data = storage.read_bytes(target)
    except ImportError:
        raise
    except Exception as err:  # noqa: BLE001 - unreachable storage: a cold compile, not a crash
        return _not_loaded(result, f"could not be read ({type(err).__name__}: {err})")
    if data is None:
        result.reason = "no artifact at this path yet"
        return result
    result.artifact_bytes = len(data)
    data, trailer = signature.split(data)
    try:  # before anything in it is parsed, written or unpickled
        result.signature = signature.check(data, trailer, keys)
    except SignatureRefused as refused:
        result.signature = f"refused: {refused}"
        return _not_loaded(result, f"refused: {refused}; nothing in it was used")
    if trailer is not None and not keys.accepted:
        warnings.warn(
            f"compile cache {target!r} is {result.signature}: it is loaded as an "
            f"unsigned one would be. Set ${signature.ENV_KEY} (or pass key=) to check "
            "who wrote it.",
            CompileCacheWarning,
            stacklevel=3,
        )
    try:
        artifact = unpack(data, current_environment=current_environment())
    except ArtifactRefused as refused:
        result.mismatches = refused.mismatches
        return _not_loaded(
            result,
            f"built in another environment ({refused}); save a new one "
            "from this environment (torch's cache keys would not catch all of it)",
        )
    except ArtifactUnreadable as err:
        return _not_loaded(result, f"ignored: {err}")
    try:
        # Kernels first: by the time a cached graph is visible, the kernels it needs are too.
        result.kernel_files = install_kernel_files(artifact.kernel_files, cache_dir)
        if artifact.mega_cache is not None:
            entries = _dynamo.load_mega_cache(artifact.mega_cache)
            if entries is None:
                return _not_loaded(result, "torch could not read the mega-cache in it")
            result.mega_cache_entries = entries
    except Exception as err:  # noqa: BLE001 - e.g. disk full: a cold compile, not a crash
        return _not_loaded(result, f"could not be installed ({type(err).__name__}: {err})")
    result.loaded = True
    regions = artifact.header["contents"].get("precompiled_regions", [])
    result.precompiled_regions = [region["label"] for region in regions]
    _dynamo.remember_loaded_regions(regions)
    result.counters_at_load = _dynamo.compile_cache_counters()
    if any(kernel.name.endswith(".so") for kernel in artifact.kernel_files):
        # After the install: the probe's own test libraries are among the installed kernels.
        known = artifact.header["contents"].get("cpu_vec_isas")
        result.cpu_isa_probe_started = _dynamo.start_cpu_isa_probe(known=known) is not None
    logger.info(result.summary())
    return result


def _not_loaded(result: CacheLoadResult, reason: str) -> CacheLoadResult:
    result.reason = reason
    warnings.warn(
        f"{result.summary()}. Training continues with a cold compile.",
        CompileCacheWarning,
        stacklevel=4,
    )
    return result
