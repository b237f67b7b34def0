"""Compile PEFT models safely: refuse known-bad configurations, compile in place, guard at runtime.

The rules are data (:mod:`.rule_table`), :mod:`.evaluation` enforces them, :mod:`.guard` checks
what is only safe in some contexts; peft is imported lazily.
"""

from __future__ import annotations

import warnings
from typing import Any

from torch import nn

from .. import _dynamo
from .._checks import check_choice, check_flag
from .._moved import refuses_moved
from ..regional import compile_model, compile_regional, find_repeated_blocks, get_regional_plan
from .evaluation import check_on_violation, enforce, evaluate_rules
from .facts import describe_peft_model
from .guard import AdapterGuard
from .record import Decision, GenerateMode, PeftCompileRecord
from .schema import AdapterFacts, OnViolation, SafetyFinding

__all__ = ["check_peft_compile_safety", "compile_peft"]


def check_peft_compile_safety(
    model: nn.Module,
    *,
    fullgraph: bool = False,
    training: bool | None = None,
    backend: Any = "inductor",
    options: dict[str, Any] | None = None,
    on_violation: OnViolation = "error",
) -> list[SafetyFinding]:
    """Apply the PEFT x ``torch.compile`` rule table (docs/peft.md) to ``model`` before it is
    compiled.

    Refusals cover what breaks or silently miscomputes (PEFT on a ``torch.compile`` wrapper,
    inductor ``freezing`` while training, ``fullgraph`` with DoRA or LoKr/LoHa training, adapter
    dropout with checkpointing on CUDA); warnings cover graph breaks and untested combinations.

    Args:
        model: the uncompiled ``PeftModel``.
        fullgraph: the planned ``torch.compile(fullgraph=...)``.
        training: whether the compiled model will train; ``None`` reads ``model.training``.
        backend: the planned ``torch.compile`` backend.
        options: the planned inductor ``options`` (``{"freezing": True}`` matters).
        on_violation: ``"error"`` raises on refusals and warns on warnings; ``"warn"`` turns
            refusals into warnings; ``"ignore"`` only returns the findings.

    Returns:
        Every finding, in rule-table order; empty when nothing fired.

    Raises:
        UnsafeAdapterConfigError: a refusal fired with ``on_violation="error"`` (all are listed).
        ValueError: unknown ``on_violation``.

    Example:
        >>> check_peft_compile_safety(dora_model, fullgraph=True)  # doctest: +SKIP
        Traceback (most recent call last):
        UnsafeAdapterConfigError: refusing to compile PeftModelForCausalLM: 1 rule violated ...
    """
    return _check(
        model,
        fullgraph=fullgraph,
        training=training,
        backend=backend,
        options=options,
        on_violation=on_violation,
        operation="check_peft_compile_safety",
    )[1]


def _check(
    model: nn.Module,
    *,
    extra: list[SafetyFinding] | None = None,
    decisions: list[Decision] | None = None,
    on_violation: OnViolation,
    operation: str = "compile_peft",
    **describe: Any,
) -> tuple[AdapterFacts, list[SafetyFinding]]:
    check_on_violation(on_violation)
    facts = describe_peft_model(model, **describe)
    findings = evaluate_rules(facts) + (extra or [])
    enforce(
        findings, on_violation, subject=facts.model_class, decisions=decisions, operation=operation
    )
    return facts, findings


@refuses_moved
def compile_peft(
    model: nn.Module,
    *,
    regional: bool = True,
    on_violation: OnViolation = "error",
    hotswap_target_rank: int | None = None,
    generate: GenerateMode = "eager",
    verify: bool = True,
    **compile_kwargs: Any,
) -> nn.Module:
    """Check a PEFT model, compile it in place, and guard the risky runtime operations.

    Compiling in place (regionally by default) keeps ``state_dict()`` keys free of ``_orig_mod.``,
    so ``save_pretrained``, ``load_adapter`` and ``set_adapter`` keep working. The compiled regions
    guard on module hooks (PEFT's ``adapter_names=`` pre-hooks; experimental: a private dynamo
    switch, ``_dynamo/hook_guards.py``, until dynamo guards hooks by default) and dynamo guards
    adapter state, so
    no call runs a stale graph. After compiling, the model re-checks the rules when adapters are
    added or deleted, refuses ``adapter_names=`` under ``fullgraph=True``, warns once when it has
    run in more adapter states than ``recompile_limit``, and runs ``generate()`` as ``generate=``
    says. What was decided is kept as data (:func:`get_peft_compile_record`); docs/peft.md ("PEFT at
    run time") has each case checked against eager.

    Args:
        model: the uncompiled ``PeftModel``, with every adapter you will switch between loaded.
        regional: compile each repeated block (``compile_regional``); ``False`` compiles the whole
            ``PeftModel`` in place (``compile_model``).
        on_violation: see :func:`check_peft_compile_safety`; applies to the runtime guards too.
        hotswap_target_rank: prepare LoRA adapters for compiled hotswapping (peft's
            ``prepare_model_for_compiled_hotswap``, the largest rank you will swap in), so
            ``hotswap_adapter`` never recompiles.
        generate: ``"eager"`` (default) runs ``generate()`` with the compiled blocks skipped (a
            KV-cache decode compiles about 4 graphs per layer); ``"compiled"`` raises the blocks'
            limit by 4 per block for this compile so generation runs compiled. Regional only.
        verify: compare the first forward in each adapter state with eager (outputs and adapter
            gradients) and raise ``CompiledMismatchError`` if they differ. On by default (PEFT
            setups that run without error yet compute wrongly are what this recipe guards
            against).
        **compile_kwargs: passed to ``compile_regional`` / ``compile_model`` (``precompile``)
            and ``torch.compile`` (``backend``, ``mode``, ``fullgraph``, ``dynamic``, ``options``).

    Returns:
        ``model`` itself, compiled.

    Raises:
        UnsafeAdapterConfigError: see :func:`check_peft_compile_safety`.
        ValueError: ``hotswap_target_rank`` with a non-LoRA adapter; bad ``on_violation`` or
            ``generate``; ``NoRepeatedBlocksError`` when ``regional=True`` finds no blocks.
        TypeError: ``verify`` is not a bool.

    Example:
        >>> model = compile_peft(get_peft_model(base, LoraConfig(r=8)))  # doctest: +SKIP
        >>> model.save_pretrained("adapter")  # keys as without compile  # doctest: +SKIP
    """
    check_choice(
        "generate",
        generate,
        ("eager", "compiled"),
        hint="'eager' skips the compiled blocks in generate(); 'compiled' compiles them",
    )
    check_flag("verify", verify, caller="compile_peft")
    fullgraph = bool(compile_kwargs.get("fullgraph", False))
    decisions: list[Decision] = []
    facts, _ = _check(
        model,
        fullgraph=fullgraph,
        backend=compile_kwargs.get("backend", "inductor"),
        options=compile_kwargs.get("options"),
        on_violation=on_violation,
        decisions=decisions,
    )
    if hotswap_target_rank is not None:
        _prepare_hotswap(model, hotswap_target_rank)
    limit = _dynamo.recompile_limit()
    if (
        regional
        and generate == "compiled"
        and "recompile_limit" not in compile_kwargs
        and _dynamo.recompile_limit_kwarg() is not None
    ):
        # per compile call, never global: room for ~4 graphs per block on top of the usual limit
        # (a torch without torch.compile(recompile_limit=) keeps the global one: the recompile-limit
        # rule then warns when generation runs past it)
        blocks = len(find_repeated_blocks(model).blocks)
        limit = compile_kwargs["recompile_limit"] = limit + 4 * blocks
    limit = int(compile_kwargs.get("recompile_limit") or limit)
    if regional:
        compile_regional(model, verify=False, **compile_kwargs)  # the guard below checks
        # the limit in force for the blocks: compile_regional may have sized one for their
        # frozen/trainable variants (what the guard's messages must name)
        plan = get_regional_plan(model)
        limit = (
            max([limit, *(g.budget.limit for g in plan.groups if g.budget is not None)])
            if plan is not None
            else limit
        )
    else:
        if check_flag(
            "precompile",
            compile_kwargs.pop("precompile", False),
            caller="compile_peft",
        ):
            warnings.warn(
                "compile_peft(regional=False, precompile=True): a whole PeftModel is "
                "not precompiled: torch saves its entry but cannot load it again "
                "(measured on torch 2.10, 2.13 and 2.15: objects in its guards that do "
                "not survive the save), so a restart traces it again (its kernels still "
                "load from the cache). Use the default regional=True to precompile its "
                "blocks.",
                stacklevel=2,
            )
        compile_model(model, verify=False, **compile_kwargs)  # the guard below checks
    if facts.is_peft_model:
        record = PeftCompileRecord(
            regional=regional,
            generate=generate,
            recompile_limit=limit,
            decisions=decisions,
            adapters=list(facts.peft_types),
        )
        AdapterGuard(
            model,
            fullgraph=fullgraph,
            regional=regional,
            on_violation=on_violation,
            record=record,
            compile_kwargs=compile_kwargs,
            verify=verify,
        ).install()
    return model


def _prepare_hotswap(model: nn.Module, target_rank: int) -> None:
    from peft.utils.hotswap import prepare_model_for_compiled_hotswap

    configs = getattr(model, "peft_config", {})
    not_lora = {n: str(getattr(c.peft_type, "value", c.peft_type)) for n, c in configs.items()}
    not_lora = {n: kind for n, kind in not_lora.items() if kind != "LORA"}
    if not_lora:
        raise ValueError(
            f"hotswap_target_rank={target_rank!r} needs LoRA adapters only, but "
            f"{not_lora!r} are not LoRA; peft hotswaps LoRA only. Drop "
            "hotswap_target_rank, or use LoRA adapters."
        )
    prepare_model_for_compiled_hotswap(model, target_rank=target_rank, config=configs)
