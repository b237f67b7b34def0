"""Precompiled regions: block groups whose compiled code a restart runs without tracing.

A group compiled with ``compile_regional(..., precompile=True)`` runs through a root function of
ours (undecorated, so transformers' decorated forwards load) under dynamo's precompile cache
(``_dynamo.precompiling``). That cache keys an entry by the root's name and drops the guards on
classes, functions and object identity, so the root's name carries a fingerprint of what those
guards would have checked: every class inside the block and its source, the functions and values
its modules hold, the block's config, its parameters and the compile options. A change anywhere
is another key: torch's cache misses, the region is traced again, and a
:class:`~torchcompile_kit.errors.CompileCacheWarning` names the field that changed
(docs/cache.md, "Warm starts that skip dynamo").
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import inspect
import json
import logging
import re
import sys
import types
import warnings
from pathlib import Path
from typing import Any

import torch
from torch import nn

from .. import _dynamo
from .._collect import Collector
from ..errors import CompileCacheWarning

__all__ = [
    "PrecompiledRegion",
    "function_fingerprint",
    "precompile_refusal",
    "region_fingerprint",
    "regions_created",
]

logger = logging.getLogger(__name__)


def precompile_refusal(compile_kwargs: dict[str, Any], preflight: Any) -> str | None:
    """Why a group cannot be precompiled safely here, or ``None`` when it can."""
    backend = compile_kwargs.get("backend", "inductor")
    if backend != "inductor":
        return f"backend {backend!r}: only inductor's compiled code can be saved with dynamo's"
    if compile_kwargs.get("mode") not in (None, "default"):
        # torch.compile takes mode= or options=, and the guard filter precompile needs is an option
        return f"mode={compile_kwargs['mode']!r} cannot be combined with the guard filter it needs"
    if preflight is not None and (preflight.warning or preflight.may_vary):
        # the dropped identity guards are what keeps such blocks apart
        return "its blocks differ in per-instance state (guard preflight)"
    return None


def region_fingerprint(module: nn.Module, compile_kwargs: dict[str, Any]) -> dict[str, str]:
    """Digests of what the guards dropped by dynamo's precompile cache would have checked.

    Example:
        >>> region_fingerprint(torch.nn.Linear(2, 2), {  # doctest: +NORMALIZE_WHITESPACE, +SKIP
        ...     })["classes"]
        'torch.nn.modules.linear.Linear'
    """
    classes = sorted({_class_name(type(m)) for m in module.modules()})
    sources = [_class_source(type(m)) for m in module.modules()]
    configs = [m.config for m in module.modules() if hasattr(m, "config")]
    params = [
        (n, tuple(p.shape), str(p.dtype), p.requires_grad) for n, p in module.named_parameters()
    ]
    attributes = [
        (name, key, _text(value))
        for name, m in module.named_modules()
        for key, value in vars(m).items()
        if not key.startswith("_") and not isinstance(value, (torch.Tensor, nn.Module))
    ]
    return {
        "classes": ", ".join(classes),
        "attributes": _digest(attributes),
        "source": _digest(sorted(set(sources))),
        "config": _digest([_config_text(c) for c in configs[:1]]),
        "parameters": _digest(params),
        "compile options": _options_digest(compile_kwargs),
    }


def function_fingerprint(fn: Any, compile_kwargs: dict[str, Any]) -> dict[str, str]:
    """:func:`region_fingerprint` of a plain function (a pinned loss): its name, source and the
    compile options."""
    try:
        source = inspect.getsource(fn)
    except (OSError, TypeError):
        source = _text(fn)
    return {
        "function": _text(fn),
        "source": _digest([source]),
        "compile options": _options_digest(compile_kwargs),
    }


class PrecompiledRegion:
    """The compiled call of one block group, ``region(module, *args, **kwargs)``, or of one function
    (``call``: ``region(*args, **kwargs)`` runs ``call`` compiled).

    Compiled at its first call (so a cache loaded any time before the first step is found), under
    dynamo's precompile cache, keyed by the group's fingerprint. :attr:`path` says what happened.
    """

    def __init__(
        self, label: str, fields: dict[str, str], compile_kwargs: dict[str, Any], call: Any = None
    ) -> None:
        self.label = label
        self.fields = fields
        self.key = f"{label}_{_digest(sorted(fields.items()))[:16]}"
        self.compile_kwargs = compile_kwargs
        self.path = "not compiled yet"
        self._compiled: Any = None
        self._hit = False
        self._refusal = ""
        self._settled = False
        self._plain: Any = None  # a usual compile, once torch's precompile cache refused it
        self._root = _make_root(self.key, call)
        _CREATED.add(self)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if self._plain is not None:
            return self._plain(*args, **kwargs)
        try:
            with _dynamo.precompiling():
                if self._compiled is None:
                    self._hit = self._compile()
                if self._settled:
                    return self._compiled(*args, **kwargs)
                before = _dynamo.compile_starts()
                output = self._compiled(*args, **kwargs)
                self._settle(traced=_dynamo.compile_starts() > before)
                return output
        except Exception as error:
            if not _dynamo.is_package_error(error):
                raise
            # torch's precompile cache refused a frame this call reached (measured: a graph break
            # into a property of peft's PeftModel; a Llama's guards on torch 2.10). It is raised
            # before that frame runs: the region goes on as a usual compile and the call runs
            # again, from its start.
            why = str(error).strip()
            self.path = f"not precompiled: torch cannot save a frame it reached ({why})"
            self._warn(
                f"torch's precompile cache cannot save it ({why})", again="compiled the usual way"
            )
            self._plain = torch.compile(self._root, **self.compile_kwargs)
            _dynamo.remember_region(self.record())
            return self._plain(*args, **kwargs)

    def record(self) -> dict[str, Any]:
        """What the artifact's header keeps of this region (and the path it took here)."""
        aliases = _dynamo.module_aliases(self._root.__globals__)
        return {
            "label": self.label,
            "key": self.key,
            "fields": self.fields,
            "modules": aliases,
            "path": self.path,
        }

    def _compile(self) -> bool:
        """``torch.compile`` the root (torch looks the saved entry up here); whether
        it found one."""
        kwargs = dict(self.compile_kwargs)
        options = dict(kwargs.pop("options", None) or {})
        options["guard_filter_fn"] = _with_class_guards_dropped(options.get("guard_filter_fn"))
        loaded = next(
            (record for record in _dynamo.loaded_regions() if record["key"] == self.key), None
        )
        if loaded is not None:  # names the saved bytecode loads, torch does not restore
            _dynamo.install_module_aliases(self._root.__globals__, loaded.get("modules", {}))
        else:  # torch would load what an earlier run left in its cache dir, unchecked
            _dynamo.forget_unvetted_entry(self._root)
        # installing a loaded entry loads its CPU kernels, which picks the vector ISA without a
        # compile (so without dynamo's start-of-compile callback that waits for a background probe
        # a cache load started): wait here, or inductor probes a second time at once
        _dynamo.wait_for_cpu_isa_probe()
        before = _dynamo.dynamo_cache_counters()["dynamo_cache_hit"]
        # a loaded entry brings its kernels built: loading them needs no precompiled C++ header
        # (seconds on a machine that never compiled; _dynamo.loading_built_kernels)
        loading = (
            _dynamo.loading_built_kernels() if loaded is not None else contextlib.nullcontext()
        )
        with _dynamo.refusals_logged() as refusals, loading:
            try:
                self._compiled = torch.compile(self._root, options=options, **kwargs)
            except Exception as error:  # noqa: BLE001 - torch catches only a RuntimeError here
                # installing the loaded entry failed (measured: a TypeError unpickling a LoRA
                # block's guards on torch 2.10 and 2.13): compile as if there were none, without
                # torch's precompile cache, which would find the same entry again
                refusals.append(f"{type(error).__name__}: {error}")
                with _dynamo.without_precompile():
                    self._compiled = torch.compile(self._root, **self.compile_kwargs)
        self._refusal = "; ".join(refusals)
        hit = _dynamo.dynamo_cache_counters()["dynamo_cache_hit"] > before
        if (
            hit
        ):  # the entry installed its globals in the root's module: a later trace must not clash
            _dynamo.step_past_installed_names(self._root.__globals__)
        return hit

    def _settle(self, *, traced: bool) -> None:
        """Say which path the region took, at its first call that ran compiled (or traced)."""
        if not traced and (not self._hit or not _dynamo.dynamo_enabled()):
            return  # nothing compiled and nothing ran compiled (dynamo off): ask again next call
        self._settled = True
        if not traced:
            self.path = "precompiled (no trace)"
        elif self._hit:
            self.path = (
                f"traced again: torch refused its saved entry ({self._refusal or 'see its log'})"
            )
            self._warn(f"torch refused that entry ({self._refusal or 'see its log'})")
        else:
            self.path = "traced (saved for the next restart)"
            self._explain_miss()
        _dynamo.remember_region(self.record())
        logger.info("precompiled region %s: %s", self.label, self.path)

    def _explain_miss(self) -> None:
        same = [r for r in _dynamo.loaded_regions() if r["label"] == self.label]
        differs = sorted(
            {f for r in same for f, v in r["fields"].items() if self.fields.get(f) != v}
        )
        if not differs:
            return
        self.path = f"traced again: its {', '.join(differs)} changed since the cache was saved"
        self._warn(
            f"it was compiled with another {' and '.join(differs)}; that entry is not used "
            "(it could run a stale graph)"
        )

    def _warn(self, why: str, again: str = "traced again") -> None:
        warnings.warn(
            f"compile cache: {self.label}: {why}; it is {again} (its kernels may still "
            "load from the cache).",
            CompileCacheWarning,
            stacklevel=5,
        )


_CREATED: Collector[PrecompiledRegion] = Collector()


def regions_created() -> contextlib.AbstractContextManager[list[PrecompiledRegion]]:
    """The :class:`PrecompiledRegion` objects created inside the block (a compile call's
    regions)."""
    return _CREATED.collecting()


def _with_class_guards_dropped(user_filter: Any) -> Any:
    if user_filter is None:
        return _dynamo.drop_class_guards

    def both(entries: Any) -> list[bool]:
        return [a and b for a, b in zip(user_filter(entries), _dynamo.drop_class_guards(entries))]

    return both


def _make_root(key: str, call: Any) -> Any:
    def region_call(module: nn.Module, *args: Any, **kwargs: Any) -> Any:
        return _dynamo.eager_call(module, *args, **kwargs)

    def function_call(*args: Any, **kwargs: Any) -> Any:
        return call(*args, **kwargs)

    template = region_call if call is None else function_call
    name = f"tck_region_{key}"
    # A code object of its own per region: dynamo keeps its cache, and a loaded entry, on the code
    # object, so two regions sharing one would take each other's entries (measured: the
    # captioner's ViTLayer group ran GPT2Block's guards and was traced again). Its name is the key
    # dynamo's precompile cache looks the entry up by (with the first line).
    code = template.__code__.replace(co_name=name)
    root = types.FunctionType(code, template.__globals__, name, None, template.__closure__)
    root.__qualname__ = name
    return root


def _class_name(cls: type) -> str:
    return f"{cls.__module__}.{cls.__qualname__}"


def _class_source(cls: type) -> str:
    """Digests of the source files of ``cls`` and of every base it inherits code from, with the
    class names (torch's own classes are covered by the torch version in the artifact's header).

    A whole file, not the class's lines: finding a class in a large module's source takes
    ``inspect`` ~0.1 s (seconds for a whole transformers model), a file's digest microseconds,
    and any edit of the file then misses, the safe direction."""
    parts = []
    for base in cls.__mro__:
        if base is object or base.__module__.split(".")[0] in ("torch", "builtins"):
            continue
        source = getattr(sys.modules.get(base.__module__), "__file__", None)
        parts.append(f"{_class_name(base)}:{_file_digest(source)}")
    return ", ".join(parts)


@functools.cache
def _file_digest(path: str | None) -> str:
    """sha256 of a source file, or ``"no file"`` (a class defined interactively: its name stands
    in)."""
    try:
        return hashlib.sha256(Path(path).read_bytes()).hexdigest()[:16] if path else "no file"
    except OSError:
        return "unreadable"


def _config_text(config: Any) -> str:
    if hasattr(config, "to_json_string"):
        return config.to_json_string(use_diff=False)
    return repr(config)


def _text(value: Any) -> str:
    """``value`` as text that is the same in every process (no object addresses)."""
    if isinstance(value, functools.partial):
        return f"partial({_text(value.func)}, {_text(value.args)}, {_text(value.keywords)})"
    if isinstance(value, (list, tuple)):
        return f"({', '.join(_text(v) for v in value)})"
    if isinstance(value, dict):
        return json.dumps({str(k): _text(v) for k, v in value.items()}, sort_keys=True)
    if callable(value) and hasattr(value, "__qualname__"):
        return f"{getattr(value, '__module__', '')}.{value.__qualname__}"
    return re.sub(r" at 0x[0-9a-fA-F]+", "", repr(value))


def _options_digest(compile_kwargs: dict[str, Any]) -> str:
    return _digest(sorted((k, _text(v)) for k, v in compile_kwargs.items()))


def _digest(value: Any) -> str:
    return hashlib.sha256(json.dumps(value, default=str).encode()).hexdigest()[:16]
