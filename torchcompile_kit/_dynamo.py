"""The only door to torch's private compiler APIs.

Everything in torchcompile_kit that touches a private name of torch's compiler stack
(``torch._dynamo``, ``torch._inductor``, ``torch._higher_order_ops``, ``torch._logging``,
``torch._C``, ``nn.Module._compiled_call_impl``) goes through a function here, so a torch release
that moves one of them breaks one module, not twelve. Each use says why it is needed, where
upstream it comes from, and when it can go. ``tests/test_layout.py`` fails if any other module of
the package names one of these.

Nothing here runs at import time beyond importing torch: every lookup happens when called, so a
missing name is a clear error (or a documented fallback) at the point of use.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import logging
import os
import tempfile
import threading
from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch import nn

logger = logging.getLogger(__name__)

__all__ = [
    "clear_compiled_call",
    "compilation_metrics_since",
    "compile_cache_counters",
    "compiled_module_names",
    "cpu_capability",
    "cpu_isa_probe_stats",
    "eager_call",
    "foreach_map_op",
    "frame_counting_backend",
    "fresh_inductor_cache",
    "get_compiled_call",
    "graph_break_counts",
    "guard_counts",
    "has_mega_cache",
    "has_module_hook_guard_switch",
    "has_nested_compile_region",
    "import_compiler",
    "inductor_cache_dir",
    "inductor_freezing_enabled",
    "interned_string",
    "is_compiled_module",
    "is_torch_compile_wrapper",
    "isolated_cache_kwarg",
    "limit_warning_logger",
    "load_mega_cache",
    "mark_dynamic",
    "mark_nested_region",
    "mark_static_address",
    "privateuse1_backend_name",
    "recompile_limit",
    "recompile_limit_hits",
    "recompile_limit_kwarg",
    "reset",
    "save_mega_cache",
    "set_compiled_call",
    "start_cpu_isa_probe",
    "trace_logger",
    "wait_for_cpu_isa_probe",
    "with_module_hook_guards",
]


# --- the recompile limit --------------------------------------------------------------------
# Why: a block class, a shape or an adapter state gets `recompile_limit` graphs per code object;
# past it dynamo runs the frame eagerly and says so once. Helpers size their work against it.
# Upstream: renamed from `cache_size_limit` to `recompile_limit` (the old name kept as an alias) in
# https://github.com/pytorch/pytorch/pull/143709 (Dec 2024); a torch of the declared floor (2.6) may
# only have `cache_size_limit`. Can go when the floor is a torch that has `recompile_limit`.
_LIMIT_NAMES = ("recompile_limit", "cache_size_limit")


def _limit_name(config: Any = None) -> str:
    config = torch._dynamo.config if config is None else config
    for name in _LIMIT_NAMES:
        if hasattr(config, name):
            return name
    raise RuntimeError(
        f"torch {torch.__version__} has neither torch._dynamo.config.recompile_limit nor "
        "cache_size_limit; torchcompile_kit supports torch >= 2.6."
    )


def recompile_limit(config: Any = None) -> int:
    """Dynamo's per-code-object recompile limit (8 by default), under its name for this torch.

    Args:
        config: a stand-in for ``torch._dynamo.config`` (tests switch the probe with it).
    """
    config = torch._dynamo.config if config is None else config
    return int(getattr(config, _limit_name(config)))


def recompile_limit_kwarg(compile_fn: Callable[..., Any] | None = None) -> str | None:
    """The ``torch.compile`` keyword that sets the limit for one compile call, or ``None``.

    ``compile_fn`` stands in for ``torch.compile`` (tests switch the probe with it).

    Why: raising the limit for one block group must not raise it globally. Upstream:
    ``torch.compile(..., recompile_limit=)`` came with
    https://github.com/pytorch/pytorch/pull/177936 (2026); where it is missing the caller warns
    instead. Can go when every supported torch has it.
    """
    params = inspect.signature(compile_fn or torch.compile).parameters
    return "recompile_limit" if "recompile_limit" in params else None


def isolated_cache_kwarg(compile_fn: Callable[..., Any] | None = None) -> dict[str, bool]:
    """``{"isolate_recompiles": True}`` where ``torch.compile`` takes it, else ``{}``.

    ``compile_fn`` stands in for ``torch.compile`` (tests switch the probe with it).

    Why: a frame of ours shared by several compiled regions (torch.nn modules, which dynamo will
    not trace as a top-level frame) must not share one recompile budget across them. Upstream:
    ``torch.compile(isolate_recompiles=)`` came with https://github.com/pytorch/pytorch/pull/178351
    (2026); without it the regions share one budget and may recompile up to the limit. Can go when
    every supported torch has it.
    """
    params = inspect.signature(compile_fn or torch.compile).parameters
    return {"isolate_recompiles": True} if "isolate_recompiles" in params else {}


# --- compiled-module detection --------------------------------------------------------------
# Why: `module.compile()` stores the compiled call in the private `_compiled_call_impl`
# (`Module.compile` in torch/nn/modules/module.py, which `_call_impl` checks first); torch has no
# public "is this compiled" or "uncompile", and no upstream issue asking for one was found. Can go
# when torch offers either.


def is_torch_compile_wrapper(obj: object) -> bool:
    """Whether ``obj`` is a ``torch.compile(module)`` wrapper (``OptimizedModule``, ``_orig_mod``)."""
    return isinstance(obj, torch._dynamo.eval_frame.OptimizedModule)


def is_compiled_module(module: nn.Module) -> bool:
    """Whether ``module.compile()`` was called on ``module`` itself (or a helper set its call)."""
    return getattr(module, "_compiled_call_impl", None) is not None


def compiled_module_names(model: nn.Module) -> list[str]:
    """Qualified names of the modules inside ``model`` compiled in place (``""`` for ``model``)."""
    return [name for name, module in model.named_modules() if is_compiled_module(module)]


def set_compiled_call(module: nn.Module, compiled: Callable[..., Any] | None) -> None:
    """Make ``module(...)`` run ``compiled`` (what ``nn.Module.compile`` does), or undo it."""
    module._compiled_call_impl = compiled


def get_compiled_call(module: nn.Module) -> Callable[..., Any] | None:
    """What ``module(...)`` runs instead of its eager ``_call_impl``, if anything."""
    return getattr(module, "_compiled_call_impl", None)


def clear_compiled_call(module: nn.Module) -> None:
    """Undo ``module.compile()`` (there is no public undo; see above)."""
    set_compiled_call(module, None)


def eager_call(module: nn.Module, *args: Any, **kwargs: Any) -> Any:
    """Run ``module`` through its eager call path (hooks included), skipping a compiled call."""
    return module._call_impl(*args, **kwargs)


# --- marking tensors ------------------------------------------------------------------------
# Why: `torch._dynamo.mark_dynamic` / `mark_static_address` are the documented way to mark dims and
# addresses, but live under the private `torch._dynamo` namespace; the move of dynamo's user APIs to
# the public `torch.compiler` (https://github.com/pytorch/pytorch/pull/102182) did not take them.
# Can go when `torch.compiler` has both.


def mark_dynamic(tensor: torch.Tensor, dim: int, *, min: int | None = None, max: int | None = None) -> None:
    """``torch._dynamo.mark_dynamic`` with its ``min``/``max`` bounds."""
    torch._dynamo.mark_dynamic(tensor, dim, min=min, max=max)


def mark_static_address(tensor: torch.Tensor) -> None:
    """``torch._dynamo.mark_static_address``: the address is a guard, not a graph input copy."""
    torch._dynamo.mark_static_address(tensor)


def reset() -> None:
    """Forget every compiled graph and guard (a cold start): the public ``torch.compiler.reset``."""
    torch.compiler.reset()


# --- counting -------------------------------------------------------------------------------
# Why: a benchmark row must say how many graphs dynamo really compiled and whether the recompile
# limit dropped a frame to eager. Upstream: `torch._dynamo.testing.CompileCounter` and
# `torch._dynamo.utils.counters` are testing/debug aids with no public twin; CompileMonitor
# (diagnostics) reads the structured trace instead. Can go when torch.compiler exposes counts.


def frame_counting_backend() -> Any:
    """A backend that counts frames (``.frame_count``) and runs the graph eagerly."""
    from torch._dynamo.testing import CompileCounter

    return CompileCounter()


def recompile_limit_hits() -> int:
    """How often dynamo gave up on a frame at the recompile limit since the last reset."""
    from torch._dynamo.utils import counters

    return sum(n for key, n in counters["unimplemented"].items() if "recompile_limit" in key)


# --- inductor -------------------------------------------------------------------------------


def inductor_freezing_enabled() -> bool:
    """The global ``torch._inductor.config.freezing`` (the PEFT freezing rules read it)."""
    import torch._inductor.config as inductor_config

    return bool(inductor_config.freezing)


def import_compiler() -> None:
    """Import dynamo and inductor's compile entry point now (seconds, once per process).

    Why: the first ``torch.compile`` call, cache load or compile in a process imports them, so
    their cost lands in whichever of those comes first. A benchmark that compares phases (a
    cold first step against a cache load plus a warm first step) imports them up front in every
    row, as it does torch itself. Upstream: ``torch._inductor.compile_fx`` is inductor's entry
    module (private; https://github.com/pytorch/pytorch/blob/main/torch/_inductor/compile_fx.py).
    Can go when torch imports its compiler eagerly or cheaply.
    """
    import torch._dynamo
    import torch._inductor.compile_fx  # noqa: F401


def _fresh_cache_fn() -> Callable[..., Any] | None:
    """inductor's own "fresh cache" context manager under its name for this torch, or ``None``."""
    import torch._inductor.utils as inductor_utils

    return getattr(inductor_utils, "fresh_cache", None) or getattr(
        inductor_utils, "fresh_inductor_cache", None
    )


@contextlib.contextmanager
def fresh_inductor_cache() -> Iterator[str]:
    """An empty inductor cache directory for the block, so a compile is truly cold.

    Why: inductor reuses compiled kernels from ``TORCHINDUCTOR_CACHE_DIR`` across runs; a
    benchmark that wants cold compile times must not see them. Upstream:
    ``torch._inductor.utils.fresh_cache`` (older releases call it ``fresh_inductor_cache``; 2.13
    has both); the fallback points the environment variable at a temporary directory. Can go when
    torch exposes a public "cold start" switch.
    """
    fresh_cache = _fresh_cache_fn()
    torch.compiler.reset()
    try:
        if fresh_cache is not None:
            with tempfile.TemporaryDirectory(prefix="tck-inductor-") as tmp, fresh_cache(dir=tmp):
                yield tmp
        else:
            with tempfile.TemporaryDirectory(prefix="tck-inductor-") as tmp:
                old = os.environ.get("TORCHINDUCTOR_CACHE_DIR")
                os.environ["TORCHINDUCTOR_CACHE_DIR"] = tmp
                try:
                    yield tmp
                finally:
                    if old is None:
                        os.environ.pop("TORCHINDUCTOR_CACHE_DIR", None)
                    else:
                        os.environ["TORCHINDUCTOR_CACHE_DIR"] = old
    finally:
        torch.compiler.reset()


# --- compile cache ---------------------------------------------------------------------------
# The cache topic (torchcompile_kit/cache) bundles torch's mega-cache with the inductor cache dir's
# compiled kernel folders. Mega-cache: `torch.compiler.save_cache_artifacts` /
# `load_cache_artifacts` are public (https://docs.pytorch.org/docs/main/generated/
# torch.compiler.save_cache_artifacts.html, tutorial recipes/torch_compile_caching_tutorial) but
# not in every supported torch, so they are probed here.


def inductor_cache_dir() -> str:
    """The inductor cache directory this process compiles into (absolute; may not exist yet).

    Why: the CPU kernels (``.so``) that make a restart fast live there, not in the mega-cache.
    ``TORCHINDUCTOR_CACHE_DIR`` wins; otherwise torch's default, computed by the private
    ``torch._inductor.runtime.cache_dir_utils.default_cache_dir`` (``/tmp/torchinductor_<user>``).
    Its public ``cache_dir()`` twin is not used because it writes the environment variable and
    creates the folder. Upstream: documented in
    https://docs.pytorch.org/tutorials/recipes/torch_compile_caching_configuration_tutorial.html;
    no public function. Can go when ``torch.compiler`` exposes the cache dir.
    """
    directory = os.environ.get("TORCHINDUCTOR_CACHE_DIR")
    if not directory:
        from torch._inductor.runtime.cache_dir_utils import default_cache_dir

        directory = default_cache_dir()
    return os.path.abspath(directory)


def has_mega_cache() -> bool:
    """Whether ``torch.compiler.save_cache_artifacts``/``load_cache_artifacts`` exist (torch 2.7+)."""
    return hasattr(torch.compiler, "save_cache_artifacts") and hasattr(
        torch.compiler, "load_cache_artifacts"
    )


def save_mega_cache() -> tuple[bytes, dict[str, int]] | None:
    """The mega-cache bytes of everything compiled (or hit) in this process, with entry counts.

    Returns ``None`` when nothing was compiled, or when this torch has no mega-cache.
    """
    if not has_mega_cache():
        return None
    result = torch.compiler.save_cache_artifacts()
    if result is None:
        return None
    data, info = result
    return data, {kind: len(keys) for kind, keys in info.artifacts.items()}


def load_mega_cache(data: bytes) -> dict[str, int] | None:
    """Hot-load mega-cache bytes into the inductor caches; entry counts, or ``None`` if unreadable."""
    if not has_mega_cache():
        return None
    info = torch.compiler.load_cache_artifacts(data)
    if info is None:
        return None
    return {kind: len(keys) for kind, keys in info.artifacts.items()}


def compile_cache_counters() -> dict[str, int]:
    """Process-wide inductor FX-graph and AOTAutograd cache hits/misses since the last reset.

    Why: the cache must report whether a load paid off; the counts come from
    ``torch._dynamo.utils.counters`` (private; names verified in torch 2.13
    ``_inductor/codecache.py`` and ``_functorch/_aot_autograd/autograd_cache.py``). The diagnostics
    CompileMonitor may take this over. Can go when torch.compiler exposes cache statistics.
    """
    from torch._dynamo.utils import counters

    return {
        "fxgraph_cache_hit": int(counters["inductor"]["fxgraph_cache_hit"]),
        "fxgraph_cache_miss": int(counters["inductor"]["fxgraph_cache_miss"]),
        "autograd_cache_hit": int(counters["aot_autograd"]["autograd_cache_hit"]),
        "autograd_cache_miss": int(counters["aot_autograd"]["autograd_cache_miss"]),
    }


def cpu_capability() -> str:
    """The CPU vector ISA ATen dispatches to (``"AVX512"``, ``"AVX2"``, ``"DEFAULT"``, ...).

    Public (``torch.backends.cpu.get_cpu_capability``); here because inductor's CPU cache keys do
    not include it (measured: an AVX-512 cache reused under AVX2 gave hits and a NaN loss).
    """
    return str(torch.backends.cpu.get_cpu_capability())


# --- inductor's CPU vector-ISA probe ----------------------------------------------------------
# Before inductor loads or builds its first CPU kernel in a process it picks the vector ISA, and it
# verifies each candidate the CPU flags allow by building a test library and dlopen-ing it in a
# child Python (`torch._inductor.cpu_vec_isa.valid_vec_isa_list`, functools.cache'd per process;
# https://github.com/pytorch/pytorch/blob/main/torch/_inductor/cpu_vec_isa.py). Measured on the
# 12-layer GPT-2 warm start (torch 2.13, 2-core CPU): ~2 s of a ~7 s first step, spent waiting on
# ten child Pythons. The wait is the children's, not ours, so it can run beside the model build
# that comes before the first compile. Can go when inductor caches the probe across processes or
# makes it cheap.

_isa_probe_lock = threading.Lock()
_isa_probe: threading.Thread | None = None


def _isa_probe_fn() -> Callable[[], Any] | None:
    """inductor's cached probe function, or ``None`` on a torch without it (or off x86/Linux)."""
    try:
        from torch._inductor import cpu_vec_isa
    except ImportError:
        return None
    probe = getattr(cpu_vec_isa, "valid_vec_isa_list", None)
    return probe if callable(probe) and hasattr(probe, "cache_info") else None


def start_cpu_isa_probe() -> threading.Thread | None:
    """Run inductor's once-per-process CPU vector-ISA probe now, on a background thread.

    It calls the very function inductor calls at its first CPU kernel, earlier, so inductor finds
    the answer cached; no setting changes. The probe must not run twice at once (inductor's ISA
    objects edit their own compiler flags while they check them), so every dynamo compile first
    waits for a running probe: a start-of-compile callback
    (``torch._dynamo.callback.CompilationCallbackHandler``, registered once per process and a
    no-op once the probe is done). The probe therefore overlaps what runs before the first
    compile (building the model, the data), not the compile itself.

    Returns the thread, or ``None`` when the probe is not available, already done, or running.
    """
    global _isa_probe
    probe = _isa_probe_fn()
    if probe is None or probe.cache_info().currsize:
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
                probe()
            except Exception:
                logger.debug("background CPU ISA probe failed; inductor will probe itself", exc_info=True)

        # registered once; again if something cleared dynamo's callbacks since
        if _wait_before_compiling not in getattr(callback_handler, "start_callbacks", ()):
            callback_handler.register_start_callback(_wait_before_compiling)
        _isa_probe = threading.Thread(target=run, name="tck-cpu-isa-probe", daemon=True)
        _isa_probe.start()
        return _isa_probe


def _wait_before_compiling(_args: Any) -> None:
    """dynamo start-of-compile callback: let a running background ISA probe finish first."""
    wait_for_cpu_isa_probe()


def wait_for_cpu_isa_probe(timeout: float | None = None) -> bool:
    """Wait for a background probe started by :func:`start_cpu_isa_probe`; whether none is running."""
    thread = _isa_probe
    if thread is not None:
        thread.join(timeout)
        return not thread.is_alive()
    return True


def cpu_isa_probe_stats() -> dict[str, int] | None:
    """How often inductor's ISA probe ran (``misses``) and was answered from its cache (``hits``)."""
    probe = _isa_probe_fn()
    if probe is None:
        return None
    info = probe.cache_info()
    return {"hits": int(info.hits), "misses": int(info.misses)}


# --- structured trace / compile events -------------------------------------------------------
# Why: CompileMonitor (diagnostics/monitor.py) records what dynamo compiled from torch's structured
# trace, the passive, always-on event stream behind TORCH_TRACE/tlparse: `trace_structured` emits a
# record to the `torch.__trace` logger whenever that logger has a handler (it checks
# `trace_log.handlers`, torch/_logging/_internal.py), so adding our handler is the only change.
# Upstream: https://github.com/pytorch/pytorch/pull/120289 (structured trace logs, 2024); the
# record names used (`dynamo_start`, `dynamo_output_graph`, `compilation_metrics`,
# `bwd_compilation_metrics`, artifacts `recompile_reasons`/`dynamo_graph_break_reason`, `str`)
# verified in torch 2.13 (_dynamo/convert_frame.py, utils.py, guards.py, symbolic_convert.py).
# Can go when torch.compiler offers a public event API (compile callbacks are cleared by reset()
# and silent on recompile-limit hits, so `torch._dynamo.callback` is no substitute).
TRACE_LOGGER_NAME = "torch.__trace"


def trace_logger() -> logging.Logger | None:
    """torch's structured-trace logger, or ``None`` if this torch would not pass records to it.

    ``None`` when torch has no ``trace_structured`` or the logger was set above DEBUG; the
    monitor then falls back to :func:`compilation_metrics_since` and says so in its summary.
    """
    if not hasattr(torch._logging, "trace_structured"):
        return None
    log = logging.getLogger(TRACE_LOGGER_NAME)
    return log if log.isEnabledFor(logging.DEBUG) else None


LIMIT_WARNING_LOGGER_NAME = "torch._dynamo.convert_frame"


def limit_warning_logger() -> logging.Logger:
    """The logger of dynamo's "hit config.recompile_limit" WARNING (names the function).

    Why: the trace's record of a limit hit has no function name (``co_name`` is None and no
    ``dynamo_start`` is emitted, torch 2.13); the warning's ``record.args`` hold
    ``(limit_type, limit, "'fn' (file:line)", last_reason, url)``
    (torch/_dynamo/convert_frame.py). Can go with the trace section above.
    """
    return logging.getLogger(LIMIT_WARNING_LOGGER_NAME)


def interned_string(index: int) -> str | None:
    """The string torch's trace interned as ``index`` (file names in ``dynamo_start`` stacks).

    Why: each string is emitted once per process as a ``str`` record; one interned before the
    monitor started is only in ``torch._logging.structured.INTERN_TABLE`` (private). Can go with
    the trace section above.
    """
    try:
        from torch._logging.structured import INTERN_TABLE
    except ImportError:
        return None
    for text, number in list(INTERN_TABLE.items()):
        if number == index:
            return text
    return None


def compilation_metrics_since(start_time_us: int) -> list[dict[str, Any]]:
    """torch's per-frame compilation metrics that started at or after ``start_time_us``.

    The weaker source, used where the trace is missing: ``torch._dynamo.utils.
    get_compilation_metrics()`` keeps only the last 64 frames (a capped deque) and has no
    graph-break locations. Same fields as the trace's ``compilation_metrics`` records.
    Can go with the trace section above.
    """
    import dataclasses

    try:
        from torch._dynamo.utils import get_compilation_metrics
    except ImportError:
        return []
    rows = []
    for metric in get_compilation_metrics():
        row = dataclasses.asdict(metric)
        if (row.get("start_time_us") or 0) >= start_time_us:
            rows.append(row)
    return rows


def graph_break_counts() -> dict[str, int]:
    """``torch._dynamo.utils.counters["graph_break"]``: reason -> count, without locations.

    The fallback for graph breaks where the trace is missing. Process-wide, not cleared by
    ``torch._dynamo.reset()``. Can go with the trace section above.
    """
    from torch._dynamo.utils import counters

    return {str(reason): int(n) for reason, n in counters["graph_break"].items()}


# --- nested compile regions (compile_regional(nested=True)) ----------------------------------
# Why: the hybrid mode compiles the whole model once with each block's forward marked as a nested
# compile region, so dynamo traces the block once and reuses it (an `invoke_subgraph` HOP) inside
# one whole-model graph. `torch.compiler.nested_compile_region` is public (torch >= 2.8); it sets
# marker attributes on the function it wraps, so it must wrap the class's plain `forward` function
# (a bound method takes no attributes) and blocks share one cache key through it.
# Upstream: https://github.com/pytorch/pytorch/pull/137538 (invoke_subgraph HOP). The probe can go
# when torch >= 2.8 is the floor.


def has_nested_compile_region() -> bool:
    """Whether ``torch.compiler.nested_compile_region`` exists (torch >= 2.8)."""
    return hasattr(torch.compiler, "nested_compile_region")


def mark_nested_region(modules: list[nn.Module]) -> Callable[[], None]:
    """Make each module's ``forward`` a nested compile region shared by its class; return the undo.

    One marked function per class (``nested_compile_region(type(m).forward)``) is bound to every
    instance as an instance attribute, so instances of a class reuse one traced subgraph; the
    class itself is not changed.
    """
    import types

    marked: dict[type, Callable[..., Any]] = {}
    for module in modules:
        cls = type(module)
        if cls not in marked:
            marked[cls] = torch.compiler.nested_compile_region(cls.forward)
        module.forward = types.MethodType(marked[cls], module)

    def undo() -> None:
        for module in modules:
            module.__dict__.pop("forward", None)

    return undo


# --- module hook guards -------------------------------------------------------------------------
# Why: dynamo traces (inlines) the forward pre-hooks of the modules inside a compiled region, but
# by default it does not guard on the hook dicts (`skip_nnmodule_hook_guards=True`), so a graph
# traced without a hook keeps running after one is added, and vice versa. PEFT registers pre-hooks
# on every LoRA layer for each `adapter_names=` call and removes them after it: a compiled block
# then silently reuses the graph of the other case (max |diff| 0.39 on a tiny OPT). Turning the
# guards on only while *our* compiled regions are called (never globally) makes dynamo build hook
# guards for exactly those graphs; guards are built when a frame is compiled, so the switch only
# has to be on then, and it is on for every compile these wrappers trigger.
# Upstream: the switch, https://github.com/pytorch/pytorch/pull/97830; its default,
# https://github.com/pytorch/pytorch/pull/98371 ("silent correctness issues if users
# modify/remove their hooks later"); hooks ignored after compilation,
# https://github.com/pytorch/pytorch/issues/117758. Can go when dynamo guards hook changes by
# default (e.g. through module versioning, as #97830 proposes).


def has_module_hook_guard_switch() -> bool:
    """Whether this torch has ``torch._dynamo.config.skip_nnmodule_hook_guards``."""
    return hasattr(torch._dynamo.config, "skip_nnmodule_hook_guards")


def with_module_hook_guards(compiled: Callable[..., Any]) -> Callable[..., Any]:
    """Wrap a compiled callable so dynamo guards on module hooks while it runs (and compiles).

    The switch is set for the duration of the call and restored after it, exceptions included.
    It is process-wide while set: a compile on another thread during the call also gets hook
    guards (more guards, never a wrong result). Without the switch (older torch), ``compiled`` is
    returned unchanged.
    """
    if not has_module_hook_guard_switch():
        return compiled
    config = torch._dynamo.config

    @functools.wraps(compiled)
    def call(*args: Any, **kwargs: Any) -> Any:
        prior = config.skip_nnmodule_hook_guards
        config.skip_nnmodule_hook_guards = False
        try:
            return compiled(*args, **kwargs)
        finally:
            config.skip_nnmodule_hook_guards = prior

    call.__torchcompile_kit_hook_guards__ = compiled  # type: ignore[attr-defined]
    return call


def guard_counts(code: Any) -> list[int]:
    """Leaf guards of each compiled entry dynamo holds for ``code`` (a function's ``__code__``).

    Why: the cost of hook guards is measured in guards, which is load independent. Upstream:
    ``torch._dynamo.eval_frame._debug_get_cache_entry_list`` and the C++ guard managers have no
    public twin. Returns ``[]`` where this torch lacks them.
    """
    try:
        from torch._dynamo.eval_frame import _debug_get_cache_entry_list
    except ImportError:
        return []

    def count(manager: Any) -> int:
        return len(manager.get_leaf_guards()) + sum(count(c) for c in manager.get_child_managers())

    counts = []
    for entry in _debug_get_cache_entry_list(code):
        root = getattr(getattr(entry, "guard_manager", None), "root", None)
        if root is not None and hasattr(root, "get_leaf_guards"):
            counts.append(count(root))
    return counts


# --- optimizer pieces ------------------------------------------------------------------------


@functools.cache
def foreach_map_op() -> Callable[..., Any] | None:
    """``torch._higher_order_ops.foreach_map.foreach_map``, or ``None`` before torch 2.7.

    Why: the horizontally fused optimizer step is built on it; it has no public name yet.
    Upstream: https://github.com/pytorch/pytorch/pull/142098 (the HOP), documented as beta in the
    torch 2.7 recipe "Explicit horizontal fusion with foreach_map" (pytorch/tutorials#3318). Can go
    when it is exported publicly.
    """
    try:
        from torch._higher_order_ops.foreach_map import foreach_map
    except ImportError:
        return None
    return foreach_map


def privateuse1_backend_name() -> str:
    """The name a PrivateUse1 device registered under (``torch._C``), for device checks.

    Why: ``compile_optimizer`` sets ``capturable=True`` on accelerator devices, including
    out-of-tree ones registered as PrivateUse1. Upstream: no public getter for the name exists
    (``torch.utils.rename_privateuse1_backend`` sets it). Can go when one does.
    """
    return torch._C._get_privateuse1_backend_name()
