"""Compile PEFT models safely: refuse known-bad configurations, compile in place, guard at runtime.

The rules (ids, triggers, version ranges, evidence) are the data module :mod:`.rule_table`;
:mod:`.facts` describes a model for them, :mod:`.evaluation` enforces the result
(``on_violation="error" | "warn" | "ignore"``, as peft's ``check_compiled``), this module compiles,
and :mod:`.guard` checks the operations that are only safe in some contexts. peft is imported
lazily.
"""

from __future__ import annotations

from typing import Any

from torch import nn

from ..regional import compile_regional
from .evaluation import check_on_violation, enforce, evaluate_rules
from .facts import describe_peft_model
from .guard import AdapterGuard
from .schema import OnViolation, Policy, SafetyFinding

__all__ = ["check_peft_compile_safety", "compile_peft"]


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
    check_on_violation(on_violation)
    facts = describe_peft_model(
        model, fullgraph=fullgraph, training=training, backend=backend, options=options
    )
    findings = evaluate_rules(facts, policy=policy)
    enforce(findings, on_violation, subject=facts.model_class)
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
        AdapterGuard(
            model, policy=policy, fullgraph=fullgraph, regional=regional, on_violation=on_violation
        ).install()
    return model


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


