"""The PEFT x torch.compile rule table: which adapter configurations to refuse, warn about or allow.

Each :class:`AdapterRule` names its trigger, the PEFT/torch versions where it applies, its evidence
(a test in this repository or an upstream issue) and a message that says what to do instead.
Rules are evaluated against :class:`AdapterFacts`, a plain description of a PEFT model and of the
planned compile, so the table can be checked without compiling and against versions that are not
installed (``evaluate_rules(facts, peft_version="0.14.0")``).

Where the evidence comes from: ``docs/peft.md`` (measured on CPU with torch 2.13 and peft 0.21.2).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Literal

from packaging.version import Version

from ._compat import version_at_least

__all__ = [
    "RULES",
    "AdapterFacts",
    "AdapterRule",
    "SafetyFinding",
    "evaluate_rules",
    "finding",
    "rule_by_id",
    "rule_in_force",
]

Severity = Literal["refuse", "warn"]
Policy = Literal["auto", "peft-docs"]
POLICIES: tuple[str, ...] = ("auto", "peft-docs")

# Methods whose outputs and gradients matched eager here (tests/test_adapters.py matrix), plus
# VB-LoRA and MiSS, which peft's own tests/test_torch_compile.py covers.
TESTED_PEFT_TYPES = frozenset(
    {
        "LORA",
        "ADALORA",
        "BOFT",
        "IA3",
        "LN_TUNING",
        "LOHA",
        "LOKR",
        "OFT",
        "VERA",
        "HRA",
        "VBLORA",
        "MISS",
    }
)


@dataclass(kw_only=True, slots=True)
class AdapterFacts:
    """What the rules look at: the PEFT model as found, and how it is about to be compiled."""

    model_class: str
    """Class name of the model that was checked (``"PeftModelForCausalLM"``)."""
    is_peft_model: bool = True
    """A ``peft.PeftModel`` (or a module carrying a ``peft_config`` dict, as transformers' adapters do)."""
    is_mixed_model: bool = False
    """A ``peft.PeftMixedModel`` (several adapter methods at once)."""
    compiled_modules: list[str] = field(default_factory=list)
    """Paths of modules already compiled: ``"<model>"`` for a ``torch.compile`` wrapper, else names
    of modules whose ``.compile()`` was called."""
    wrapped_before_peft: list[str] = field(default_factory=list)
    """Paths of ``torch.compile`` wrappers (``_orig_mod``) found *inside* the PEFT model."""
    peft_types: dict[str, str] = field(default_factory=dict)
    """Adapter name -> PEFT type (``{"default": "LORA"}``)."""
    prompt_learning: list[str] = field(default_factory=list)
    """Adapters that are prompt-learning methods."""
    dora_adapters: list[str] = field(default_factory=list)
    lora_embedding_layers: list[str] = field(default_factory=list)
    """LoRA layers whose base layer is an ``nn.Embedding``."""
    target_parameters_adapters: list[str] = field(default_factory=list)
    dropout_adapters: list[str] = field(default_factory=list)
    """Adapters with a dropout > 0 (``lora_dropout``, ``rank_dropout``, ``module_dropout``)."""
    quantization: str | None = None
    """``"bitsandbytes"``, another quant method's name, or ``None``."""
    gradient_checkpointing: bool = False
    device_type: str = "cpu"
    training: bool = False
    fullgraph: bool = False
    backend: str = "inductor"
    freezing: bool = False
    recompile_limit: int = 8

    @property
    def n_adapters(self) -> int:
        return len(self.peft_types)

    def adapters_of(self, *peft_types: str) -> list[str]:
        return [name for name, kind in self.peft_types.items() if kind in peft_types]


@dataclass(kw_only=True, frozen=True, slots=True)
class AdapterRule:
    """One row of the rule table."""

    id: str
    """Stable identifier, shown in every message (``"dora-fullgraph"``)."""
    severity: Severity
    """``"refuse"`` raises :class:`~torchcompile_kit.UnsafeAdapterConfigError`; ``"warn"`` warns."""
    condition: str
    """The trigger, in words."""
    evidence: str
    """A test in this repository, or an upstream issue/PR."""
    message: str
    """What goes wrong and what to do instead; ``{detail}`` is replaced by what triggered it."""
    check: Callable[[AdapterFacts], str | None] | None = None
    """Static rules: returns the triggering detail, or ``None``. ``None`` for runtime rules,
    which ``compile_peft``'s guards apply when the operation happens."""
    peft_before: str | None = None
    """Applies only when peft is older than this (unless the policy says otherwise)."""
    torch_since: str | None = None
    """Applies only from this torch release on."""
    seed: bool = False
    """One of the seven items peft's pre-0.15 guide lists as not working; ``policy="peft-docs"``
    applies these on every peft version."""

    @property
    def stage(self) -> Literal["static", "runtime"]:
        return "static" if self.check is not None else "runtime"

    @property
    def versions(self) -> str:
        parts = [f"peft < {self.peft_before}"] if self.peft_before else []
        parts += [f"torch >= {self.torch_since}"] if self.torch_since else []
        return ", ".join(parts) or "all"


@dataclass(kw_only=True, frozen=True, slots=True)
class SafetyFinding:
    """A rule that fired: its id, severity and the message with the triggering detail."""

    rule_id: str
    severity: Severity
    message: str
    evidence: str

    def __str__(self) -> str:
        return f"[{self.rule_id}] {self.message} (evidence: {self.evidence})"


def _names(items: list[str], limit: int = 4) -> str:
    shown = ", ".join(repr(i) for i in items[:limit])
    return shown + (f" and {len(items) - limit} more" if len(items) > limit else "")


def _if(condition: bool, detail: str) -> str | None:
    return detail if condition else None


_TEST = "tests/test_adapters.py"
_SEED_EVIDENCE = (
    "peft docs (torch_compile.md before v0.15) and xfail(strict=True) in peft "
    "tests/test_torch_compile.py, added in huggingface/peft#1725 (v0.12), removed in #2332 (v0.15)"
)
_SEED_FIX = "upgrade to peft >= 0.15, where this passes peft's compile tests and ours"

RULES: tuple[AdapterRule, ...] = (
    # --- what was handed over ----------------------------------------------------------------
    AdapterRule(
        id="not-peft-model",
        severity="refuse",
        condition="the model is not a PeftModel (no peft_config)",
        evidence="API contract",
        message="{detail} is not a PEFT model; for a plain model use "
        "torchcompile_kit.compile_regional(model) instead.",
        check=lambda f: _if(not f.is_peft_model, repr(f.model_class)),
    ),
    AdapterRule(
        id="peft-on-compiled-model",
        severity="refuse",
        condition="PEFT was applied to a torch.compile(...) wrapper: '_orig_mod' inside the model",
        evidence=f"{_TEST}::test_peft_on_compiled_base_reloads_as_base_model; huggingface/peft#949, #2957",
        message="PEFT was applied to a torch.compile() wrapper ({detail}): adapters save under "
        "'_orig_mod.' keys and a reload silently gives base-model outputs. Apply PEFT to the "
        "uncompiled model (base._orig_mod), then call compile_peft(model).",
        check=lambda f: _if(bool(f.wrapped_before_peft), _names(f.wrapped_before_peft)),
    ),
    AdapterRule(
        id="already-compiled",
        severity="refuse",
        condition="the model or one of its modules is already compiled (_orig_mod or _compiled_call_impl)",
        evidence=f"{_TEST}::test_already_compiled_model_is_refused_both_ways; peft hotswap.py check_compiled",
        message="the model is already compiled ({detail}); compiling again stacks compilers and hides "
        "which settings apply. Pass the uncompiled model (model._orig_mod, or "
        "torchcompile_kit.uncompile(model)) and compile it once with compile_peft.",
        check=lambda f: _if(bool(f.compiled_modules), _names(f.compiled_modules)),
    ),
    # --- the seed guide's seven items: broken before peft 0.15 ---------------------------------
    AdapterRule(
        id="legacy-lokr",
        severity="refuse",
        condition="LoKr adapter",
        evidence=_SEED_EVIDENCE,
        message="LoKr adapters {detail} give wrong results under torch.compile on peft < 0.15 (policy='peft-docs' refuses it on every version); "
        f"{_SEED_FIX}, or use LoRA/LoHa.",
        check=lambda f: _if(bool(f.adapters_of("LOKR")), _names(f.adapters_of("LOKR"))),
        peft_before="0.15",
        seed=True,
    ),
    AdapterRule(
        id="legacy-lora-embedding",
        severity="refuse",
        condition="LoRA on an nn.Embedding layer",
        evidence=_SEED_EVIDENCE,
        message="LoRA on embedding layers {detail} gives wrong results under torch.compile on this "
        f"peft version; {_SEED_FIX}, or leave embeddings out of target_modules.",
        check=lambda f: _if(bool(f.lora_embedding_layers), _names(f.lora_embedding_layers)),
        peft_before="0.15",
        seed=True,
    ),
    AdapterRule(
        id="legacy-bitsandbytes",
        severity="refuse",
        condition="base model quantized with bitsandbytes",
        evidence=_SEED_EVIDENCE + "; huggingface/peft#1886",
        message="adapters on a bitsandbytes-quantized model ({detail}) do not work under "
        f"torch.compile on peft < 0.15 (policy='peft-docs' refuses it on every version); {_SEED_FIX}, or compile an unquantized model.",
        check=lambda f: _if(f.quantization == "bitsandbytes", repr(f.quantization)),
        peft_before="0.15",
        seed=True,
    ),
    AdapterRule(
        id="legacy-multiple-adapters",
        severity="refuse",
        condition="more than one adapter loaded (at compile time, or at a forward after it)",
        evidence=_SEED_EVIDENCE,
        message="inference with several adapters ({detail}) gives wrong results under torch.compile "
        f"on peft < 0.15 (policy='peft-docs' refuses it on every version); {_SEED_FIX}, or keep one adapter per compiled model.",
        check=lambda f: _if(f.n_adapters > 1, _names(list(f.peft_types))),
        peft_before="0.15",
        seed=True,
    ),
    AdapterRule(
        id="legacy-merge-and-unload",
        severity="refuse",
        condition="merge_and_unload() called on the compiled model",
        evidence=_SEED_EVIDENCE,
        message="{detail} of a compiled model gives wrong results on peft < 0.15 (policy='peft-docs' refuses it on every version); "
        f"{_SEED_FIX}, or merge the uncompiled model (torchcompile_kit.uncompile(model) first).",
        peft_before="0.15",
        seed=True,
    ),
    AdapterRule(
        id="legacy-disable-adapter",
        severity="refuse",
        condition="disable_adapter() used with the compiled model",
        evidence=_SEED_EVIDENCE + "; meta-pytorch/torchtune#721",
        message="{detail} on a compiled model gives silently wrong outputs on this peft "
        f"version; {_SEED_FIX}, or run the base model uncompiled.",
        peft_before="0.15",
        seed=True,
    ),
    AdapterRule(
        id="legacy-mixed-batch",
        severity="refuse",
        condition="forward(..., adapter_names=[...]) on the compiled model",
        evidence=_SEED_EVIDENCE,
        message="mixed adapter batches (adapter_names={detail}) give wrong results under torch.compile "
        f"on peft < 0.15 (policy='peft-docs' refuses it on every version); {_SEED_FIX}, or batch by adapter and call set_adapter.",
        peft_before="0.15",
        seed=True,
    ),
    # --- loud failures and graph breaks on every version ---------------------------------------
    AdapterRule(
        id="dora-fullgraph",
        severity="refuse",
        condition="DoRA with fullgraph=True",
        evidence=f"{_TEST}::test_fullgraph_dora_is_refused (dynamo: 'Unsupported method call' in "
        "peft's dequantize_module_weight, one per DoRA layer)",
        message="DoRA adapters {detail} cannot be traced with fullgraph=True (a graph break in every "
        "DoRA layer); pass fullgraph=False.",
        check=lambda f: _if(f.fullgraph and bool(f.dora_adapters), _names(f.dora_adapters)),
    ),
    AdapterRule(
        id="dora-graph-breaks",
        severity="warn",
        condition="DoRA without fullgraph",
        evidence=f"{_TEST}::test_matrix (DoRA: 24 breaks on a 2-layer OPT, see docs/peft.md)",
        message="DoRA adapters {detail} break the graph once per DoRA layer, so the speed-up is "
        "small; correct results are kept. Consider plain LoRA for compiled training.",
        check=lambda f: _if(not f.fullgraph and bool(f.dora_adapters), _names(f.dora_adapters)),
    ),
    AdapterRule(
        id="lokr-loha-training-fullgraph",
        severity="refuse",
        condition="LoKr/LoHa in training with fullgraph=True",
        evidence="docs/peft.md (dynamo: 'Data-dependent branching' on torch.rand(1) > module_dropout "
        "in peft's LoKr/LoHa forward)",
        message="LoKr/LoHa adapters {detail} branch on torch.rand(1) > module_dropout in training, "
        "which fullgraph=True cannot trace; pass fullgraph=False, or compile for inference "
        "(model.eval()).",
        check=lambda f: _if(
            f.training and f.fullgraph and bool(f.adapters_of("LOKR", "LOHA")),
            _names(f.adapters_of("LOKR", "LOHA")),
        ),
    ),
    AdapterRule(
        id="lokr-loha-training-graph-breaks",
        severity="warn",
        condition="LoKr/LoHa in training without fullgraph",
        evidence="docs/peft.md (LoKr/LoHa training: 14 graphs, 10 breaks on a 2-layer OPT)",
        message="LoKr/LoHa adapters {detail} break the graph in every adapted layer during "
        "training (data-dependent module_dropout branch); results stay correct, the speed-up is small.",
        check=lambda f: _if(
            f.training and not f.fullgraph and bool(f.adapters_of("LOKR", "LOHA")),
            _names(f.adapters_of("LOKR", "LOHA")),
        ),
    ),
    # --- silent failures on every version ------------------------------------------------------
    AdapterRule(
        id="inductor-freezing-training",
        severity="refuse",
        condition="backend='inductor' with freezing=True while training",
        evidence="docs/peft.md (research run: LoRA hotswap under freezing=True, max diff 0.57, "
        "outputs silently stale); inductor freezing treats parameters as constants by design",
        message="inductor freezing=True bakes the adapter weights into the graph as constants "
        "({detail}): training, hotswapping or loading adapters afterwards is silently ignored. "
        "Drop options={{'freezing': True}} (and torch._inductor.config.freezing) for training.",
        check=lambda f: _if(f.freezing and f.training, "training"),
    ),
    AdapterRule(
        id="inductor-freezing",
        severity="warn",
        condition="backend='inductor' with freezing=True, not training",
        evidence="docs/peft.md (hotswap under freezing: max diff 0.57)",
        message="inductor freezing=True bakes the adapter weights into the graph ({detail}): "
        "hotswap_adapter, load_adapter into an existing name or any later weight update is "
        "silently ignored. Use it only for a fixed adapter.",
        check=lambda f: _if(f.freezing and not f.training, "inference"),
    ),
    AdapterRule(
        id="cuda-dropout-checkpointing",
        severity="refuse",
        condition="adapter dropout > 0, inductor on CUDA, gradient checkpointing, torch >= 2.13",
        evidence="pytorch/pytorch#198333 (open: inductor corrupts CUDA dropout masks under "
        "activation checkpointing; labelled correctness (silent))",
        message="adapter dropout in {detail} with gradient checkpointing gives wrong gradients "
        "with inductor on CUDA in this torch (pytorch#198333); set the adapter dropout to 0, turn "
        "off gradient checkpointing, or use backend='aot_eager'.",
        check=lambda f: _if(
            bool(f.dropout_adapters)
            and f.backend == "inductor"
            and f.device_type == "cuda"
            and f.gradient_checkpointing
            and f.training,
            _names(f.dropout_adapters),
        ),
        torch_since="2.13",
    ),
    # --- performance and coverage warnings -----------------------------------------------------
    AdapterRule(
        id="many-adapters",
        severity="warn",
        condition="more adapters loaded than torch._dynamo.config.recompile_limit",
        evidence=f"{_TEST}::test_guard_warns_past_recompile_limit (cycling 10 adapters: 8 graphs, "
        "then eager without an error)",
        message="{detail} adapters are loaded but dynamo keeps at most recompile_limit graphs per "
        "code object; switching past that runs eagerly without an error. Hotswap instead "
        "(compile_peft(..., hotswap_target_rank=r), then peft.utils.hotswap.hotswap_adapter), or "
        "raise torch._dynamo.config.recompile_limit.",
        check=lambda f: _if(f.n_adapters > f.recompile_limit, str(f.n_adapters)),
    ),
    AdapterRule(
        id="untested-method",
        severity="warn",
        condition="adapter method outside the tested set, prompt learning, or a PeftMixedModel",
        evidence=f"{_TEST}::test_matrix covers {sorted(TESTED_PEFT_TYPES - {'VBLORA', 'MISS'})}; "
        "peft tests/test_torch_compile.py adds VBLORA, MISS",
        message="{detail} has no torch.compile coverage here or upstream; verify it with "
        "torchcompile_kit.check_compile_equivalence(model, batch) before relying on it.",
        check=lambda f: _if(
            f.is_mixed_model
            or bool(f.prompt_learning)
            or any(kind not in TESTED_PEFT_TYPES for kind in f.peft_types.values()),
            "a PeftMixedModel"
            if f.is_mixed_model
            else _names(
                sorted({k for k in f.peft_types.values() if k not in TESTED_PEFT_TYPES})
                + [f"{n} (prompt learning)" for n in f.prompt_learning]
            ),
        ),
    ),
    AdapterRule(
        id="target-parameters",
        severity="warn",
        condition="LoraConfig(target_parameters=...)",
        evidence="huggingface/peft#3304; LoraConfig docstring ('re-compilation and/or graph breaks "
        "are expected')",
        message="LoRA with target_parameters ({detail}) uses torch.nn.utils.parametrize, which "
        "recompiles and breaks the graph; target modules instead where possible.",
        check=lambda f: _if(
            bool(f.target_parameters_adapters), _names(f.target_parameters_adapters)
        ),
    ),
    AdapterRule(
        id="quantized-base",
        severity="warn",
        condition="quantized base model",
        evidence="peft tests/test_torch_compile.py (4-bit bitsandbytes, GPU only); not run here",
        message="the base model is quantized ({detail}); this combination was not verified by this "
        "library. Check it with torchcompile_kit.check_compile_equivalence(model, batch).",
        check=lambda f: _if(f.quantization is not None, repr(f.quantization)),
    ),
    # --- runtime: compile_peft's guards --------------------------------------------------------
    AdapterRule(
        id="mixed-batch-fullgraph",
        severity="refuse",
        condition="forward(..., adapter_names=[...]) on a model compiled with fullgraph=True",
        evidence="docs/peft.md (dynamo: setattr() on RemovableHandle in peft's forward hooks)",
        message="adapter_names={detail} registers forward hooks, which fullgraph=True cannot trace; "
        "compile with fullgraph=False, or batch by adapter and call set_adapter.",
    ),
    AdapterRule(
        id="recompile-limit",
        severity="warn",
        condition="the compiled model has run in more adapter states than recompile_limit",
        evidence=f"{_TEST}::test_guard_warns_past_recompile_limit",
        message="the compiled model has now run with {detail}; each state (active adapters, "
        "disabled, merged, adapter_names) is its own graph and dynamo keeps at most "
        "recompile_limit of them, so later states run eagerly without an error. Load all adapters "
        "before compile_peft and hotswap them (compile_peft(..., hotswap_target_rank=r)), bucket "
        "batches by adapter, or raise torch._dynamo.config.recompile_limit.",
    ),
    AdapterRule(
        id="generate-uncompiled",
        severity="warn",
        condition="generate() on a model compiled whole (regional=False)",
        evidence="docs/peft.md (compiled.generate(): 0 graphs; PeftModel.generate calls the eager "
        "base model)",
        message="generate() on {detail} never runs the compiled graph; compile with "
        "compile_peft(model) (regional=True), which compiles the blocks generate() runs through.",
    ),
)


def _check_policy(policy: str) -> None:
    if policy not in POLICIES:
        raise ValueError(
            f"policy={policy!r} is not one of {POLICIES}; use 'auto' (rules for the installed "
            "versions) or 'peft-docs' (also refuse everything peft's pre-0.15 guide lists)."
        )


def rule_in_force(
    rule: AdapterRule,
    *,
    policy: Policy = "auto",
    peft_version: str | Version | None = None,
    torch_version: str | Version | None = None,
) -> bool:
    """Whether ``rule`` applies under ``policy`` for the given (default: installed) versions.

    Args:
        rule: a row of :data:`RULES`.
        policy: ``"auto"`` applies version-ranged rules by version; ``"peft-docs"`` applies the
            seed guide's items on every peft version.
        peft_version: evaluate against this declared peft version instead of the installed one.
        torch_version: likewise for torch.

    Returns:
        ``True`` when the rule should be checked.

    Raises:
        ValueError: unknown ``policy``.

    Example:
        >>> lokr = next(r for r in RULES if r.id == "legacy-lokr")
        >>> rule_in_force(lokr, peft_version="0.14.0"), rule_in_force(lokr, peft_version="0.15.0")
        (True, False)
    """
    _check_policy(policy)
    if rule.seed and policy == "peft-docs":
        return True
    if rule.peft_before and version_at_least("peft", rule.peft_before, installed=peft_version):
        return False
    if rule.torch_since and not version_at_least(
        "torch", rule.torch_since, installed=torch_version
    ):
        return False
    return True


def evaluate_rules(
    facts: AdapterFacts,
    *,
    policy: Policy = "auto",
    peft_version: str | Version | None = None,
    torch_version: str | Version | None = None,
) -> list[SafetyFinding]:
    """Apply every static rule in force to ``facts``; no warning or error is emitted here.

    Args:
        facts: the model and compile plan (``torchcompile_kit.adapters.describe_peft_model``).
        policy: see :func:`rule_in_force`.
        peft_version: evaluate against this declared peft version instead of the installed one.
        torch_version: likewise for torch.

    Returns:
        One :class:`SafetyFinding` per rule that fired, in table order.

    Raises:
        ValueError: unknown ``policy``.

    Example:
        >>> facts = AdapterFacts(model_class="PeftModel", peft_types={"default": "LOKR"})
        >>> [f.rule_id for f in evaluate_rules(facts, peft_version="0.14.0")]
        ['legacy-lokr']
    """
    _check_policy(policy)
    findings = []
    for rule in RULES:
        if rule.check is None or not rule_in_force(
            rule, policy=policy, peft_version=peft_version, torch_version=torch_version
        ):
            continue
        detail = rule.check(facts)
        if detail is not None:
            findings.append(finding(rule, detail))
    return findings


def finding(rule: AdapterRule, detail: str) -> SafetyFinding:
    """The :class:`SafetyFinding` of ``rule`` fired by ``detail``."""
    return SafetyFinding(
        rule_id=rule.id,
        severity=rule.severity,
        message=rule.message.format(detail=detail),
        evidence=rule.evidence,
    )


def rule_by_id(rule_id: str) -> AdapterRule:
    """The row of :data:`RULES` with this id (``KeyError`` names the known ids)."""
    for rule in RULES:
        if rule.id == rule_id:
            return rule
    raise KeyError(f"no adapter rule {rule_id!r}; known: {[r.id for r in RULES]}")
