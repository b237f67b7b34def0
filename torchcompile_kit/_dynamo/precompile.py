"""Dynamo's precompile cache: compiled regions that a restart runs without tracing.

Part of the one door to torch's private compiler APIs (see ``_dynamo/__init__.py``)."""

from __future__ import annotations

import contextlib
import itertools
import logging
import os
import re
import warnings
from collections.abc import Iterator, Sequence
from typing import Any

__all__ = [
    "compile_starts",
    "drop_class_guards",
    "dynamo_cache_counters",
    "dynamo_enabled",
    "forget_unvetted_entry",
    "install_module_aliases",
    "is_package_error",
    "loaded_regions",
    "module_aliases",
    "precompiled_regions",
    "precompiling",
    "refusals_logged",
    "remember_loaded_regions",
    "remember_region",
    "step_past_installed_names",
    "without_precompile",
]

# The regions of this process whose entries a save carries (key -> record), and those a loaded
# artifact carried: the region code (regional/precompiled.py) and the cache (cache/api.py) meet
# here, below both.
_COMPILED: dict[str, dict[str, Any]] = {}
_LOADED: dict[str, dict[str, Any]] = {}


# --- dynamo's precompile cache ----------------------------------------------------------------
# Why: a restart re-traces every frame even when the mega-cache holds its graphs (warm ÷ cold
# first step 0.06-0.12, docs/benchmarks.md). `torch._dynamo.config.caching_precompile` (private,
# experimental; present on 2.10-2.15) also records dynamo's bytecode and guards per compiled code
# object and saves them with the mega-cache (`torch.compiler.save_cache_artifacts`);
# `torch.compile(fn)` looks an entry up, when it is called, by `sha256(fn.__qualname__ +
# co_firstlineno)` (`_dynamo/package.py`, `CompilePackage.source_id_from_fn`), so a loaded entry
# runs with no trace. The flag is on only while a region of ours is compiled, runs and is saved
# (`precompiling()`), never around the user's own torch.compile calls: it drops the ID_MATCH,
# CLOSURE_MATCH, WEAKREF_ALIVE and DICT_VERSION guards of everything compiled under it
# (`_dynamo/guards.py`). The backward is lowered with the forward
# (`torch._functorch.config.force_non_lazy_backward_lowering`), inside the scope, so its compiled
# code joins the entry (without it a load says "Backend not found" and re-traces: measured, 2.13).
# CLASS_MATCH guards cannot be serialized (the compile is then a "package bypass": nothing is
# saved), so a region drops them (`drop_class_guards`) and carries the classes in its key instead
# (regional/precompiled.py). Measured on a tiny Llama, inductor, CPU: warm first step 0.01-0.02 s
# against 10-18 s cold on torch 2.10, 2.13 and 2.15, no frame traced, losses and gradients equal
# bit for bit. Upstream: https://github.com/pytorch/pytorch/pull/155913 (caching_precompile,
# DynamoCache), https://github.com/pytorch/pytorch/pull/162886 (saved with the mega-cache).
# Can go when torch.compile offers a public warm start that keeps (or lets us check) these guards.


@contextlib.contextmanager
def precompiling() -> Iterator[None]:
    """``caching_precompile`` and eager backward lowering on, for this block only."""
    import torch._dynamo.config as dynamo_config
    import torch._functorch.config as functorch_config

    if not _QUIET_GRAD_WARNING:
        # Installed once, on first use (not per region call): torch reads every tensor's .grad to
        # serialize its guards, and the warning that raises for non-leaf tensors says nothing
        # about the user's code; the dropped-guard records exist only under this scope.
        warnings.filterwarnings("ignore", message=_GRAD_WARNING, module="torch._dynamo.guards")
        logging.getLogger("torch._dynamo.guards").addFilter(_quiet_dropped_guards)
        _QUIET_GRAD_WARNING.append(True)
    with (
        dynamo_config.patch(caching_precompile=True),
        functorch_config.patch(force_non_lazy_backward_lowering=True),
    ):
        yield


@contextlib.contextmanager
def without_precompile() -> Iterator[None]:
    """``caching_precompile`` off for this block (a compile that must not look its entry up)."""
    import torch._dynamo.config as dynamo_config

    with dynamo_config.patch(caching_precompile=False):
        yield


def _quiet_dropped_guards(record: logging.LogRecord) -> bool:
    # one WARNING per dropped guard (dozens per block): the region's key stands in for them
    return "is dropped with caching_precompile" not in str(record.msg)


_QUIET_GRAD_WARNING: list[bool] = []
_GRAD_WARNING = r"The \.grad attribute of a Tensor that is not a leaf Tensor is being accessed"


def forget_unvetted_entry(fn: Any) -> bool:
    """Delete torch's on-disk precompile entry for ``fn`` (``DynamoCache``, in the inductor cache
    dir, keyed by the function's qualified name and first line only); whether there was one.

    torch looks an entry up there at ``torch.compile`` time whatever wrote it: a run that saved a
    cache earlier, or another torch version sharing the directory. Only an entry that came in
    through a checked artifact may load (its header vouches for it, and it carries the module
    aliases the saved bytecode needs: without them a torch 2.15 Llama compiled whole failed with
    ``NameError: ___module_collections_…`` at its first call). torch 2.10 to 2.15 keep an entry
    in ``<cache dir>/dynamo/<source id>/`` (torch/_dynamo/package.py, ``DiskDynamoStore``)."""
    import shutil

    from torch._dynamo.package import CompilePackage, DynamoCache

    path = os.path.join(DynamoCache.path_prefix(), CompilePackage.source_id_from_fn(fn))
    if not os.path.exists(path):
        return False
    shutil.rmtree(path, ignore_errors=True)
    return True


def is_package_error(error: BaseException) -> bool:
    """Whether ``error`` is torch's precompile cache failing to save a frame: its ``PackageError``,
    or an assertion of torch's own guard code. The latter is measured on torch 2.10 only, for a
    transformers Llama compiled whole (``Guarded object must be identical, None or ephemeral``,
    raised from ``torch/_guards.py`` while the first trace builds the guards it would save); 2.13
    and 2.15 compile it. Can go when the floor is torch >= 2.13."""
    from torch._dynamo.exc import PackageError

    if isinstance(error, PackageError):
        return True
    traceback = error.__traceback__
    while traceback is not None and traceback.tb_next is not None:
        traceback = traceback.tb_next
    innermost = traceback.tb_frame.f_code.co_filename if traceback is not None else ""
    return isinstance(error, AssertionError) and innermost.endswith(
        os.path.join("torch", "_guards.py")
    )


def drop_class_guards(entries: Sequence[Any]) -> list[bool]:
    """A ``guard_filter_fn`` keeping every guard but CLASS_MATCH (which cannot be serialized)."""
    return [entry.guard_type != "CLASS_MATCH" for entry in entries]


def dynamo_cache_counters() -> dict[str, int]:
    """``counters["dynamo_cache"]``: ``dynamo_cache_hit`` / ``dynamo_cache_miss`` lookups so far."""
    from torch._dynamo.utils import counters

    found = counters["dynamo_cache"]
    return {name: int(found.get(name, 0)) for name in ("dynamo_cache_hit", "dynamo_cache_miss")}


def remember_region(record: dict[str, Any]) -> None:
    """Note a region compiled under :func:`precompiling` (``{"label", "key", "fields"}``)."""
    _COMPILED[record["key"]] = record


def precompiled_regions() -> list[dict[str, Any]]:
    """The regions :func:`remember_region` noted, for a save's header."""
    return list(_COMPILED.values())


def remember_loaded_regions(records: Sequence[dict[str, Any]]) -> None:
    """Note the regions a loaded artifact carried, for a region that misses to say why."""
    _LOADED.update({record["key"]: record for record in records})


def loaded_regions() -> list[dict[str, Any]]:
    """The regions :func:`remember_loaded_regions` noted."""
    return list(_LOADED.values())


def compile_starts() -> int:
    """How many times dynamo started compiling since this was first asked (a start callback).

    Why: a ``dynamo_cache_hit`` counts a lookup, also one whose entry torch then refuses (its own
    source check or a failed guard); a region ran without a trace only when no compile started
    during its call. ``counters["frames"]`` misses ``fullgraph=True`` compiles, dynamo's start
    callbacks (``torch._dynamo.callback``, run by every frame compile) do not. Can go with the
    section above.
    """
    from torch._dynamo.callback import callback_handler

    if _count_start not in callback_handler.start_callbacks:
        callback_handler.register_start_callback(_count_start)
    return _STARTS[0]


def dynamo_enabled() -> bool:
    """Whether a compiled call runs compiled code now: not under ``set_stance("force_eager")``
    (``eval_frame._stance``, private) nor ``torch._dynamo.config.disable``. Can go with the section
    above."""
    import torch._dynamo.config as dynamo_config
    from torch._dynamo import eval_frame

    return eval_frame._stance.stance != "force_eager" and not dynamo_config.disable


_STARTS = [0]


def _count_start(_args: Any) -> None:
    _STARTS[0] += 1


def step_past_installed_names(scope: dict[str, Any]) -> None:
    """Make the next trace's global names miss those a loaded entry installed in ``scope``.

    Why: before torch 2.15 a trace names the globals it installs with a process-wide counter
    (``bytecode_transformation.unique_id``), which starts at 0 in every process, so a trace after
    an entry loaded from another process picks a name that entry already installed and fails
    ("Name '__builtins_dict___0' already exists in scope": measured on 2.10 and 2.13 at the first
    recompile after a precompiled load). torch 2.15 picks names free in the scope
    (``unique_id_unbound_in``) and needs nothing. Can go when torch 2.15 is the floor.
    """
    from torch._dynamo import bytecode_transformation

    if hasattr(bytecode_transformation, "unique_id_unbound_in"):
        return
    used = [
        int(m.group(1))
        for name in list(scope)
        if name.startswith("__") and (m := re.search(r"_(\d+)$", name))
    ]
    if used:
        start = max(max(used) + 1, next(bytecode_transformation._unique_id_counter))
        bytecode_transformation._unique_id_counter = itertools.count(start)


def module_aliases(scope: dict[str, Any]) -> dict[str, str]:
    """The modules a trace installed in ``scope`` under names of its own: ``{name: module name}``.

    Why: when a graph's output rebuilds an object whose class lives in a module the root's globals
    do not name (``collections.OrderedDict`` under transformers' ``ModelOutput``), the saved
    bytecode loads the module through a global ``___module_<name>_<id>_c<n>``
    (``PyCodegen.create_load_python_module``, ``install_global_by_id``), which the precompile entry
    does not record, so a restart fails with ``NameError: name '___module_collections_…'`` (measured
    on a GPT-2 compiled whole, 2.13 and 2.15). The region's record carries these names, and
    :func:`install_module_aliases` puts them back before the load. Can go with the section above.
    """
    import types

    return {
        name: value.__name__
        for name, value in list(scope.items())
        if name.startswith("___module_") and isinstance(value, types.ModuleType)
    }


def install_module_aliases(scope: dict[str, Any], aliases: dict[str, str]) -> None:
    """Bind each of :func:`module_aliases`' names in ``scope`` to its module in this process."""
    import importlib

    for name, module_name in aliases.items():
        scope.setdefault(name, importlib.import_module(module_name))


@contextlib.contextmanager
def refusals_logged() -> Iterator[list[str]]:
    """Collect why torch refused a saved entry while a ``torch.compile`` call looked it up.

    Why: torch catches what fails while it installs a loaded entry and only logs it ("Failed to
    load entry from dynamo cache" with the exception, ``eval_frame.py``; "Backend not found",
    ``package.py``), then traces as if there were none. Can go with the section above.
    """
    found: list[str] = []

    class _Collect(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            if record.levelno < logging.WARNING or record.name not in _LOADERS:
                return
            error = record.exc_info[1] if record.exc_info else None
            found.append(f"{type(error).__name__}: {error}" if error else record.getMessage())

    handler = _Collect()  # on the parent: the two loggers propagate to it
    logger = logging.getLogger("torch._dynamo")
    logger.addHandler(handler)
    try:
        yield found
    finally:
        logger.removeHandler(handler)


_LOADERS = ("torch._dynamo.eval_frame", "torch._dynamo.package")
