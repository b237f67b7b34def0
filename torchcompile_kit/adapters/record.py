"""What ``compile_peft`` and its runtime guard decided, as data (:class:`PeftCompileRecord`, kept on
the model: :func:`get_peft_compile_record`), with its measured side from a ``CompileMonitor``.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any, Literal, NamedTuple

from torch import nn

from ..regional import get_regional_plan
from .schema import SafetyFinding

if TYPE_CHECKING:
    from ..diagnostics import CompileMonitor

__all__ = [
    "RECORD_ATTR",
    "AdapterState",
    "Decision",
    "PeftCompileRecord",
    "get_peft_compile_record",
]

RECORD_ATTR = "_torchcompile_kit_peft_record"

Verdict = Literal["refused", "warned", "ignored"]
Stage = Literal["compile", "runtime"]
GenerateMode = Literal["eager", "compiled"]


class AdapterState(NamedTuple):
    """The adapter state a call of a compiled PEFT model ran in (each is a graph of its own, and
    the first call in each is checked against eager). ``str()`` says it in words.

    Example:
        >>> str(AdapterState(("default",), False, False, None, True))
        "adapter 'default' active, not merged, grad on"
    """

    active: tuple[str, ...] | None
    """The active adapters (``None``: the model has no adapter layer)."""
    disabled: bool | None
    """Inside ``disable_adapter()``."""
    merged: bool | None
    """The adapters merged into the base weights."""
    adapter_names: tuple[str, ...] | None
    """The per-sample ``adapter_names=`` of a mixed batch, if the call passed them."""
    grad: bool
    """Grad mode on."""

    def __str__(self) -> str:
        parts = []
        if self.active is not None:
            names = ", ".join(repr(n) for n in self.active)
            parts.append(f"adapter{'s' if len(self.active) != 1 else ''} {names} active")
        if self.disabled:
            parts.append("adapters disabled (disable_adapter())")
        if self.merged is not None:
            parts.append("merged" if self.merged else "not merged")
        if self.adapter_names is not None:
            shown = ", ".join(repr(n) for n in self.adapter_names[:4])
            more = ", ..." if len(self.adapter_names) > 4 else ""
            parts.append(f"adapter_names=[{shown}{more}] per sample")
        parts.append(f"grad {'on' if self.grad else 'off'}")
        return ", ".join(parts)


@dataclass(kw_only=True, frozen=True, slots=True)
class Decision:
    """One rule that fired and what was done about it."""

    rule_id: str
    """The rule's id (``"mixed-batch-fullgraph"``); the table is
    ``torchcompile_kit.adapters.RULES``."""
    severity: Literal["refuse", "warn"]
    """What the rule asks for."""
    verdict: Verdict
    """What was done: ``"refused"`` (raised), ``"warned"`` or ``"ignored"`` (``on_violation``)."""
    stage: Stage
    """``"compile"`` (``compile_peft``) or ``"runtime"`` (a call of the compiled model)."""
    operation: str
    """What triggered it: ``"compile_peft"``, ``"forward"``, ``"generate"``,
    ``"disable_adapter"``..."""
    message: str
    """The rule's message with the triggering detail."""
    evidence: str
    """The test or upstream issue behind the rule."""

    @classmethod
    def of(
        cls, finding: SafetyFinding, *, verdict: Verdict, stage: Stage, operation: str
    ) -> Decision:
        """The decision taken on ``finding``."""
        return cls(
            rule_id=finding.rule_id,
            severity=finding.severity,
            verdict=verdict,
            stage=stage,
            operation=operation,
            message=finding.message,
            evidence=finding.evidence,
        )


@dataclass(kw_only=True, slots=True)
class PeftCompileRecord:
    """How a PEFT model was compiled and everything its checks decided since.

    Example:
        >>> model = compile_peft(peft_model, backend="aot_eager")  # doctest: +SKIP
        >>> record = get_peft_compile_record(model)  # doctest: +SKIP
        >>> record.verdict, [d.rule_id for d in record.decisions]  # doctest: +SKIP
        ('ok', [])
    """

    regional: bool
    """Blocks compiled one by one (``True``) or the whole ``PeftModel`` (``False``)."""
    generate: GenerateMode
    """How ``generate()`` runs the blocks: ``"eager"`` or ``"compiled"``."""
    recompile_limit: int
    """Graphs dynamo keeps per compiled region before it runs it eagerly."""
    decisions: list[Decision] = field(default_factory=list)
    """Every rule that fired, in order, at compile time and at run time."""
    adapter_states: list[AdapterState] = field(default_factory=list)
    """The distinct adapter states the model ran in."""
    adapters: list[str] = field(default_factory=list)
    """The adapters loaded when the rules were last checked (compile time, or the first call
    after one was added or deleted)."""

    @property
    def verdict(self) -> Literal["refused", "warned", "ok"]:
        """``"refused"`` if anything was refused, else ``"warned"`` if anything warned, else
        ``"ok"``."""
        verdicts = {d.verdict for d in self.decisions}
        return "refused" if "refused" in verdicts else "warned" if "warned" in verdicts else "ok"

    def as_dict(self) -> dict[str, Any]:
        """Plain, JSON-able data (``verdict`` included)."""
        data = asdict(self)
        data["adapter_states"] = [list(map(_plain, state)) for state in self.adapter_states]
        data["verdict"] = self.verdict
        return data

    def report(self, model: nn.Module, monitor: CompileMonitor) -> Any:
        """The measured side: the regional plan's report of what the compiled blocks did under
        ``monitor`` (or the monitor's snapshot for a whole-model compile).

        Example:
            >>> print(get_peft_compile_record(model).report(model, mon))  # doctest: +SKIP
            OPTDecoderLayer (2 blocks): 1 graph(s) (predicted 1), 0 recompiles, ...  ok
        """
        plan = get_regional_plan(model)
        return plan.report(monitor) if plan is not None and self.regional else monitor.snapshot()


def _plain(value: Any) -> Any:
    return list(value) if isinstance(value, tuple) else value


def get_peft_compile_record(model: nn.Module) -> PeftCompileRecord | None:
    """The :class:`PeftCompileRecord` of a model compiled by ``compile_peft``, else ``None``.

    Example:
        >>> get_peft_compile_record(compile_peft(model)).verdict  # doctest: +SKIP
        'ok'
    """
    return getattr(model, RECORD_ATTR, None)
