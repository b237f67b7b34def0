"""The shape of the PEFT x torch.compile rule table: facts, rules and findings (data only).

:class:`AdapterFacts` describes a PEFT model and the planned compile; an :class:`AdapterRule` is a
row of the table (``rule_table.RULES``); a :class:`SafetyFinding` is a rule that fired.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Literal

__all__ = [
    "TESTED_PEFT_TYPES",
    "AdapterFacts",
    "AdapterRule",
    "OnViolation",
    "SafetyFinding",
    "Severity",
]

OnViolation = Literal["error", "warn", "ignore"]
ON_VIOLATION: tuple[str, ...] = ("error", "warn", "ignore")
Severity = Literal["refuse", "warn"]

# Methods whose outputs and gradients matched eager here (tests/adapters/test_compile.py matrix),
# plus
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
    """A ``peft.PeftModel`` (or a module carrying a ``peft_config`` dict, as transformers' adapters
    do)."""
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
    """``"refuse"`` raises :class:`~torchcompile_kit.errors.UnsafeAdapterConfigError`; ``"warn"``
    warns."""
    condition: str
    """The trigger, in words."""
    evidence: str
    """A test in this repository, or an upstream issue/PR."""
    message: str
    """What goes wrong and what to do instead; ``{detail}`` is replaced by what triggered it."""
    check: Callable[[AdapterFacts], str | None] | None = None
    """Static rules: returns the triggering detail, or ``None``. ``None`` for runtime rules,
    which ``compile_peft``'s guards apply when the operation happens."""
    torch_since: str | None = None
    """Applies only from this torch release on."""

    @property
    def stage(self) -> Literal["static", "runtime"]:
        return "static" if self.check is not None else "runtime"


@dataclass(kw_only=True, frozen=True, slots=True)
class SafetyFinding:
    """A rule that fired: its id, severity and the message with the triggering detail."""

    rule_id: str
    severity: Severity
    message: str
    evidence: str

    def __str__(self) -> str:
        return f"[{self.rule_id}] {self.message} (evidence: {self.evidence})"
