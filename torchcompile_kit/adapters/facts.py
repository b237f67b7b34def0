"""Describe a PEFT model and its planned compile for the rule table, without changing anything."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from .. import _dynamo
from .._compat import is_package_available
from .schema import AdapterFacts

__all__ = ["describe_peft_model"]


def describe_peft_model(
    model: nn.Module,
    *,
    fullgraph: bool = False,
    training: bool | None = None,
    backend: Any = "inductor",
    options: dict[str, Any] | None = None,
) -> AdapterFacts:
    """Describe ``model`` and the planned compile (``fullgraph``, ``training``, ``backend``,
    inductor ``options``) for the rule table, without changing anything.

    Example:
        >>> describe_peft_model(get_peft_model(base,  # doctest: +NORMALIZE_WHITESPACE, +SKIP
        ...     LoraConfig())).peft_types
        {'default': 'LORA'}
    """
    inner = model._orig_mod if _dynamo.is_torch_compile_wrapper(model) else model
    facts = AdapterFacts(
        model_class=type(model).__name__,
        compiled_modules=(["<model>"] if inner is not model else [])
        + [name or "<model>" for name in _dynamo.compiled_module_names(inner)],
        wrapped_before_peft=[
            name
            for name, m in inner.named_modules()
            if name and _dynamo.is_torch_compile_wrapper(m)
        ],
        training=inner.training if training is None else training,
        fullgraph=fullgraph,
        backend=backend
        if isinstance(backend, str)
        else getattr(backend, "__name__", repr(backend)),
        freezing=_is_freezing(backend, options),
        recompile_limit=_dynamo.recompile_limit(),
        device_type=next(inner.parameters(), torch.empty(0)).device.type,
    )
    configs = getattr(inner, "peft_config", None)
    if not is_package_available("peft") or not isinstance(configs, dict) or not configs:
        facts.is_peft_model = False
        return facts

    from peft import PeftMixedModel

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
    base = inner.get_base_model() if hasattr(inner, "get_base_model") else inner
    facts.quantization = _quantization(base)
    # transformers 5 renamed the property; reading the old name warns
    checkpointing = "is_activation_checkpointing"
    if not hasattr(type(base), checkpointing):
        checkpointing = "is_gradient_checkpointing"
    facts.gradient_checkpointing = bool(getattr(base, checkpointing, False))
    return facts


def _is_freezing(backend: Any, options: dict[str, Any] | None) -> bool:
    if backend != "inductor":
        return False
    if options and "freezing" in options:
        return bool(options["freezing"])
    return _dynamo.inductor_freezing_enabled()


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
