"""Compile PEFT models safely: refuse known-bad configurations, compile in place, guard at runtime.

The rules themselves (ids, triggers, version ranges, evidence) live in
:mod:`torchcompile_kit.adapter_rules`; this module describes a model for them, enforces the result
(``on_violation="error" | "warn" | "ignore"``, as peft's ``check_compiled``), compiles, and installs
guards for the operations that are only safe in some contexts. peft is imported lazily.
"""

from __future__ import annotations

import warnings
from collections.abc import Iterable
from typing import Any, Literal

import torch
from torch import nn

from ._compat import is_package_available
from .adapter_rules import (
    AdapterFacts,
    Policy,
    SafetyFinding,
    evaluate_rules,
    finding,
    rule_by_id,
    rule_in_force,
)
from .errors import UnsafeAdapterConfigError
from .regional import add_undo, compile_regional

__all__ = ["check_peft_compile_safety", "compile_peft", "describe_peft_model"]

OnViolation = Literal["error", "warn", "ignore"]
_ON_VIOLATION = ("error", "warn", "ignore")
_GUARD_ATTR = "_torchcompile_kit_adapter_guard"


def describe_peft_model(
    model: nn.Module,
    *,
    fullgraph: bool = False,
    training: bool | None = None,
    backend: Any = "inductor",
    options: dict[str, Any] | None = None,
) -> AdapterFacts:
    """Describe ``model`` and the planned compile for the rule table, without changing anything.

    Args:
        model: a ``PeftModel`` (or a ``torch.compile`` wrapper of one, reported as compiled).
        fullgraph: the planned ``torch.compile(fullgraph=...)``.
        training: whether the compiled model will train; ``None`` reads ``model.training``.
        backend: the planned backend; only ``"inductor"`` matters to the freezing rules.
        options: the planned inductor ``options``; ``freezing`` is read from here, else from
            ``torch._inductor.config.freezing``.

    Returns:
        The :class:`~torchcompile_kit.adapter_rules.AdapterFacts`.

    Example:
        >>> describe_peft_model(get_peft_model(base, LoraConfig())).peft_types  # doctest: +SKIP
        {'default': 'LORA'}
    """
    from torch._dynamo.eval_frame import OptimizedModule

    inner = model._orig_mod if isinstance(model, OptimizedModule) else model
    named = list(inner.named_modules())
    facts = AdapterFacts(
        model_class=type(model).__name__,
        compiled_modules=(["<model>"] if inner is not model else [])
        + [
            name or "<model>"
            for name, m in named
            if getattr(m, "_compiled_call_impl", None) is not None
        ],
        wrapped_before_peft=[name for name, m in named if name and isinstance(m, OptimizedModule)],
        training=inner.training if training is None else training,
        fullgraph=fullgraph,
        backend=backend
        if isinstance(backend, str)
        else getattr(backend, "__name__", repr(backend)),
        freezing=_is_freezing(backend, options),
        recompile_limit=_recompile_limit(),
        device_type=next(inner.parameters(), torch.empty(0)).device.type,
    )
    configs = getattr(inner, "peft_config", None)
    if not is_package_available("peft") or not isinstance(configs, dict) or not configs:
        facts.is_peft_model = False
        return facts

    from peft import PeftMixedModel
    from peft.tuners.lora import LoraLayer

    facts.is_mixed_model = isinstance(inner, PeftMixedModel)
    for name, config in configs.items():
        kind = getattr(config.peft_type, "value", config.peft_type)
        facts.peft_types[name] = str(kind)
        if getattr(config, "is_prompt_learning", False):
            facts.prompt_learning.append(name)
        if getattr(config, "use_dora", False):
            facts.dora_adapters.append(name)
        if getattr(config, "target_parameters", None):
            facts.target_parameters_adapters.append(name)
        dropouts = ("lora_dropout", "rank_dropout", "module_dropout")
        if any((getattr(config, attr, 0.0) or 0.0) > 0 for attr in dropouts):
            facts.dropout_adapters.append(name)
    facts.lora_embedding_layers = [
        name
        for name, m in named
        if isinstance(m, LoraLayer) and isinstance(m.get_base_layer(), nn.Embedding)
    ]
    base = inner.get_base_model() if hasattr(inner, "get_base_model") else inner
    facts.quantization = _quantization(base)
    # transformers 5 renamed the property; reading the old name warns
    checkpointing = "is_activation_checkpointing"
    if not hasattr(type(base), checkpointing):
        checkpointing = "is_gradient_checkpointing"
    facts.gradient_checkpointing = bool(getattr(base, checkpointing, False))
    return facts


def check_peft_compile_safety(
    model: nn.Module,
    *,
    fullgraph: bool = False,
    training: bool | None = None,
    backend: Any = "inductor",
    options: dict[str, Any] | None = None,
    policy: Policy = "auto",
    on_violation: OnViolation = "error",
) -> list[SafetyFinding]:
    """Apply the PEFT x ``torch.compile`` rule table to ``model`` before it is compiled.

    Refusals cover what is known to break or silently miscompute (PEFT applied to a
    ``torch.compile`` wrapper, inductor ``freezing`` while training, ``fullgraph`` with DoRA or
    with LoKr/LoHa training, and on peft < 0.15 the seven items peft's guide then listed);
    warnings cover graph breaks and untested combinations. See ``docs/peft.md`` for the table.

    Args:
        model: the uncompiled ``PeftModel``.
        fullgraph: the planned ``torch.compile(fullgraph=...)``.
        training: whether the compiled model will train; ``None`` reads ``model.training``.
        backend: the planned ``torch.compile`` backend.
        options: the planned inductor ``options`` (``{"freezing": True}`` matters).
        policy: ``"auto"`` applies rules for the installed peft/torch; ``"peft-docs"`` also
            refuses everything peft's pre-0.15 guide lists as not working, on every version.
        on_violation: ``"error"`` raises on refusals and warns on warnings; ``"warn"`` turns
            refusals into warnings; ``"ignore"`` only returns the findings.

    Returns:
        Every finding (refusals and warnings), in rule-table order; empty when nothing fired.

    Raises:
        UnsafeAdapterConfigError: a refusal fired and ``on_violation="error"``; the message lists
            every refusal, not just the first.
        ValueError: unknown ``policy`` or ``on_violation``.

    Example:
        >>> model = get_peft_model(base, LoraConfig(use_dora=True))  # doctest: +SKIP
        >>> check_peft_compile_safety(model, fullgraph=True)  # doctest: +SKIP
        Traceback (most recent call last):
        UnsafeAdapterConfigError: refusing to compile PeftModelForCausalLM: 1 rule violated ...
    """
    _check_on_violation(on_violation)
    facts = describe_peft_model(
        model, fullgraph=fullgraph, training=training, backend=backend, options=options
    )
    findings = evaluate_rules(facts, policy=policy)
    _enforce(findings, on_violation, subject=facts.model_class)
    return findings


def compile_peft(
    model: nn.Module,
    *,
    regional: bool = True,
    policy: Policy = "auto",
    on_violation: OnViolation = "error",
    hotswap_target_rank: int | None = None,
    **compile_kwargs: Any,
) -> nn.Module:
    """Check a PEFT model, compile it in place, and guard the risky runtime operations.

    Compiling in place (regionally by default) keeps ``state_dict()`` keys free of
    ``_orig_mod.``, so ``save_pretrained``, ``load_adapter`` and ``set_adapter`` keep working and
    checkpoints reload both ways. After compiling, the model:

    - refuses ``adapter_names=`` in a forward when compiled with ``fullgraph=True``;
    - warns, once, with the count and the fix when it has run in more adapter states (active
      adapters, disabled, merged, ``adapter_names``) than dynamo's ``recompile_limit``, past
      which dynamo silently runs eagerly;
    - on peft < 0.15 (or ``policy="peft-docs"``) refuses ``disable_adapter()``,
      ``merge_and_unload()``, mixed batches and a second adapter;
    - with ``regional=False``, warns that ``generate()`` does not use the compiled graph.

    Args:
        model: the uncompiled ``PeftModel``, with every adapter you will switch between loaded.
        regional: compile each repeated block (``compile_regional``); ``False`` compiles the whole
            ``PeftModel`` in place with ``model.compile(**compile_kwargs)``.
        policy: see :func:`check_peft_compile_safety`.
        on_violation: see :func:`check_peft_compile_safety`; applies to the runtime guards too.
        hotswap_target_rank: prepare LoRA adapters for compiled hotswapping before compiling
            (``peft.utils.hotswap.prepare_model_for_compiled_hotswap`` with this target rank, the
            largest rank you will swap in), so ``hotswap_adapter`` never recompiles.
        **compile_kwargs: passed to ``torch.compile`` (``backend``, ``mode``, ``fullgraph``,
            ``dynamic``, ``options``).

    Returns:
        ``model`` itself, compiled.

    Raises:
        UnsafeAdapterConfigError: see :func:`check_peft_compile_safety`.
        ValueError: ``hotswap_target_rank`` with a non-LoRA adapter; bad ``policy`` or
            ``on_violation``; ``NoRepeatedBlocksError`` when ``regional=True`` finds no blocks.

    Example:
        >>> model = compile_peft(get_peft_model(base, LoraConfig(r=8)))  # doctest: +SKIP
        >>> model.save_pretrained("adapter")  # keys as without compile  # doctest: +SKIP
    """
    fullgraph = bool(compile_kwargs.get("fullgraph", False))
    findings = check_peft_compile_safety(
        model,
        fullgraph=fullgraph,
        backend=compile_kwargs.get("backend", "inductor"),
        options=compile_kwargs.get("options"),
        policy=policy,
        on_violation=on_violation,
    )
    if hotswap_target_rank is not None:
        _prepare_hotswap(model, hotswap_target_rank)
    if regional:
        compile_regional(model, **compile_kwargs)
    else:
        model.compile(**compile_kwargs)
    if not any(f.rule_id == "not-peft-model" for f in findings):
        _AdapterGuard(
            model, policy=policy, fullgraph=fullgraph, regional=regional, on_violation=on_violation
        ).install()
    return model


# --- enforcement -------------------------------------------------------------------------------


def _check_on_violation(on_violation: str) -> None:
    if on_violation not in _ON_VIOLATION:
        raise ValueError(
            f"on_violation={on_violation!r} is not one of {_ON_VIOLATION}; use 'error' to refuse, "
            "'warn' to compile anyway with warnings, or 'ignore'."
        )


def _enforce(
    findings: Iterable[SafetyFinding],
    on_violation: OnViolation,
    *,
    subject: str,
    stacklevel: int = 3,
) -> None:
    findings = list(findings)
    if on_violation == "ignore":
        return
    refusals = [f for f in findings if f.severity == "refuse"]
    for f in findings:
        if f.severity == "warn" or on_violation == "warn":
            warnings.warn(str(f), UserWarning, stacklevel=stacklevel)
    if refusals and on_violation == "error":
        lines = "\n".join(f"  - {f}" for f in refusals)
        error = UnsafeAdapterConfigError(
            f"refusing to compile {subject}: {len(refusals)} rule(s) violated:\n{lines}\n"
            "Fix each one, or pass on_violation='warn' to go ahead anyway."
        )
        error.findings = refusals
        raise error


def _is_freezing(backend: Any, options: dict[str, Any] | None) -> bool:
    if backend != "inductor":
        return False
    if options and "freezing" in options:
        return bool(options["freezing"])
    import torch._inductor.config as inductor_config

    return bool(inductor_config.freezing)


def _recompile_limit() -> int:
    config = torch._dynamo.config
    return int(getattr(config, "recompile_limit", None) or config.cache_size_limit)


def _quantization(base: nn.Module) -> str | None:
    if getattr(base, "is_loaded_in_4bit", False) or getattr(base, "is_loaded_in_8bit", False):
        return "bitsandbytes"
    config = getattr(getattr(base, "config", None), "quantization_config", None)
    if config is None:
        return None
    method = (
        config.get("quant_method")
        if isinstance(config, dict)
        else getattr(config, "quant_method", None)
    )
    return str(getattr(method, "value", method)) if method is not None else "unknown"


def _prepare_hotswap(model: nn.Module, target_rank: int) -> None:
    from peft.utils.hotswap import prepare_model_for_compiled_hotswap

    configs = getattr(model, "peft_config", {})
    not_lora = {n: str(getattr(c.peft_type, "value", c.peft_type)) for n, c in configs.items()}
    not_lora = {n: kind for n, kind in not_lora.items() if kind != "LORA"}
    if not_lora:
        raise ValueError(
            f"hotswap_target_rank={target_rank!r} needs LoRA adapters only, but {not_lora!r} are "
            "not LoRA; peft hotswaps LoRA only. Drop hotswap_target_rank, or use LoRA adapters."
        )
    prepare_model_for_compiled_hotswap(model, target_rank=target_rank, config=configs)


# --- runtime guards ----------------------------------------------------------------------------


class _AdapterGuard:
    """Checks made when a compiled PEFT model is used.

    Installed as bound methods of this object (a forward pre-hook, or the compiled call for a
    whole-model compile, and wrappers of a few ``PeftModel`` methods), so ``copy.deepcopy`` of the
    model rebinds them to the copy.
    """

    def __init__(
        self,
        model: nn.Module,
        *,
        policy: Policy,
        fullgraph: bool,
        regional: bool,
        on_violation: OnViolation,
    ) -> None:
        from peft.tuners.tuners_utils import BaseTunerLayer

        self.model = model
        self.policy = policy
        self.fullgraph = fullgraph
        self.regional = regional
        self.on_violation = on_violation
        # one adapter layer stands for all: set_adapter/disable/merge act on every layer alike
        self.probe = next((m for m in model.modules() if isinstance(m, BaseTunerLayer)), None)
        self.states: set[tuple[Any, ...]] = set()
        self.warned: set[str] = set()
        self.originals: dict[str, Any] = {}
        self.compiled_call: Any = None
        self.hook: Any = None

    def install(self) -> None:
        model = self.model
        setattr(model, _GUARD_ATTR, self)
        if self.regional:
            # the PeftModel's own forward stays eager: a pre-hook runs in Python on every call
            self.hook = model.register_forward_pre_hook(self.before_forward, with_kwargs=True)
        else:
            # a pre-hook would be traced by dynamo (it runs inside the compiled _call_impl), so
            # the check goes in front of the compiled call instead
            self.compiled_call = model._compiled_call_impl
            model._compiled_call_impl = self.call_compiled
        methods = ["disable_adapter", "merge_and_unload"] + ([] if self.regional else ["generate"])
        for name in methods:
            if hasattr(model, name):
                self.originals[name] = getattr(model, name)
                setattr(model, name, getattr(self, name))
        add_undo(model, self.uninstall)

    def uninstall(self) -> None:
        """Remove the checks (run by ``uncompile``, after the compiled call is gone)."""
        if self.hook is not None:
            self.hook.remove()
        for name in self.originals:
            self.model.__dict__.pop(name, None)  # the class's own method shows again
        self.model.__dict__.pop(_GUARD_ATTR, None)

    # forward --------------------------------------------------------------------------------

    def before_forward(self, module: nn.Module, args: tuple, kwargs: dict[str, Any]) -> None:
        self.check_forward(kwargs)

    def call_compiled(self, *args: Any, **kwargs: Any) -> Any:
        self.check_forward(kwargs)
        return self.compiled_call(*args, **kwargs)

    def check_forward(self, kwargs: dict[str, Any]) -> None:
        found = []
        adapter_names = kwargs.get("adapter_names")
        if adapter_names is not None:
            shown = repr(list(adapter_names)[:6])
            if self.fullgraph:
                found.append(finding(rule_by_id("mixed-batch-fullgraph"), shown))
            found += self._legacy("legacy-mixed-batch", shown)
        adapters = list(getattr(self.model, "peft_config", {}))
        if len(adapters) > 1:
            found += self._legacy("legacy-multiple-adapters", repr(adapters))
        self.states.add(self._state(adapter_names))
        limit = _recompile_limit()
        if len(self.states) > limit and "recompile-limit" not in self.warned:
            self.warned.add("recompile-limit")
            detail = f"{len(self.states)} distinct adapter states (recompile_limit={limit})"
            found.append(finding(rule_by_id("recompile-limit"), detail))
        _enforce(found, self.on_violation, subject=type(self.model).__name__)

    def _state(self, adapter_names: Any) -> tuple[Any, ...]:
        names = tuple(adapter_names) if adapter_names is not None else None
        if self.probe is None:
            return (names,)
        probe = self.probe
        return (tuple(probe.active_adapters), probe.disable_adapters, probe.merged, names)

    def _legacy(self, rule_id: str, detail: str) -> list[SafetyFinding]:
        rule = rule_by_id(rule_id)
        return [finding(rule, detail)] if rule_in_force(rule, policy=self.policy) else []

    # wrapped methods ------------------------------------------------------------------------

    def _checked_call(self, method: str, rule_id: str, *args: Any, **kwargs: Any) -> Any:
        _enforce(
            self._legacy(rule_id, f"{method}()"),
            self.on_violation,
            subject=type(self.model).__name__,
            stacklevel=4,  # past this helper and the wrapper, to the user's call
        )
        return self.originals[method](*args, **kwargs)

    def disable_adapter(self, *args: Any, **kwargs: Any) -> Any:
        return self._checked_call("disable_adapter", "legacy-disable-adapter", *args, **kwargs)

    def merge_and_unload(self, *args: Any, **kwargs: Any) -> Any:
        return self._checked_call("merge_and_unload", "legacy-merge-and-unload", *args, **kwargs)

    def generate(self, *args: Any, **kwargs: Any) -> Any:
        if "generate-uncompiled" not in self.warned:
            self.warned.add("generate-uncompiled")
            detail = f"a whole-model compiled {type(self.model).__name__}"
            _enforce(
                [finding(rule_by_id("generate-uncompiled"), detail)],
                self.on_violation,
                subject=type(self.model).__name__,
            )
        return self.originals["generate"](*args, **kwargs)
