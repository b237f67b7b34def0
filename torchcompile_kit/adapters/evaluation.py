"""Applying the rule table: which rules are in force, what fired, and what to do about it.

Rules are evaluated against :class:`~.schema.AdapterFacts`, a plain description of a PEFT model and
of the planned compile, so the table can be checked without compiling and against versions that
are not installed (``evaluate_rules(facts, torch_version="2.12.0")``).
"""

from __future__ import annotations

import warnings
from collections.abc import Iterable

from packaging.version import Version

from .._checks import check_choice
from .._compat import version_at_least
from ..errors import UnsafeAdapterConfigError
from .record import Decision, Stage
from .rule_table import RULES
from .schema import ON_VIOLATION, AdapterFacts, AdapterRule, OnViolation, SafetyFinding

__all__ = [
    "check_on_violation",
    "enforce",
    "evaluate_rules",
    "finding",
    "rule_by_id",
    "rule_in_force",
]


def rule_in_force(rule: AdapterRule, *, torch_version: str | Version | None = None) -> bool:
    """Whether ``rule`` applies to ``torch_version`` (default: the installed torch).

    Example:
        >>> rule = rule_by_id("cuda-dropout-checkpointing")
        >>> rule_in_force(rule, torch_version="2.12.0"), rule_in_force(rule, torch_version="2.13.0")
        (False, True)
    """
    return not rule.torch_since or version_at_least(
        "torch", rule.torch_since, installed=torch_version
    )


def evaluate_rules(
    facts: AdapterFacts, *, torch_version: str | Version | None = None
) -> list[SafetyFinding]:
    """One :class:`SafetyFinding` per rule in force (for ``torch_version``, default installed) that
    fires on ``facts``, in table order; nothing is emitted here.

    Example:
        >>> facts = AdapterFacts(model_class="PeftModel", peft_types={"default": "LOKR"},
        ...                      training=True, fullgraph=True)
        >>> [f.rule_id for f in evaluate_rules(facts)]
        ['lokr-loha-training-fullgraph']
    """
    findings = []
    for rule in RULES:
        if rule.check is None or not rule_in_force(rule, torch_version=torch_version):
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


def check_on_violation(on_violation: str) -> None:
    """Refuse an unknown ``on_violation`` with the three choices and what each does."""
    check_choice(
        "on_violation",
        on_violation,
        ON_VIOLATION,
        hint="use 'error' to refuse, 'warn' to compile anyway with warnings, or 'ignore'",
    )


def enforce(
    findings: Iterable[SafetyFinding],
    on_violation: OnViolation,
    *,
    subject: str,
    stacklevel: int = 3,
    decisions: list[Decision] | None = None,
    stage: Stage = "compile",
    operation: str = "compile_peft",
) -> None:
    """Raise, warn or stay quiet about ``findings`` as ``on_violation`` says.

    With ``decisions``, what was done about each finding is appended to it first (a
    :class:`~.record.Decision`), so the record holds refusals too.
    """
    findings = list(findings)
    if decisions is not None:
        for f in findings:
            verdict = (
                "ignored"
                if on_violation == "ignore"
                else "refused"
                if f.severity == "refuse" and on_violation == "error"
                else "warned"
            )
            decisions.append(Decision.of(f, verdict=verdict, stage=stage, operation=operation))
    if on_violation == "ignore":
        return
    refusals = [f for f in findings if f.severity == "refuse"]
    for f in findings:
        if f.severity == "warn" or on_violation == "warn":
            warnings.warn(str(f), UserWarning, stacklevel=stacklevel)
    if refusals and on_violation == "error":
        error = UnsafeAdapterConfigError(_refusal_message(refusals, subject, stage, operation))
        error.findings = refusals
        raise error


def _refusal_message(
    refusals: list[SafetyFinding], subject: str, stage: Stage, operation: str
) -> str:
    """What was refused and what to do, worded for what was called (check, compile, a method)."""
    not_peft = next((f for f in refusals if f.rule_id == "not-peft-model"), None)
    if not_peft is not None:
        # No rule can pass or fail without adapters; on_violation='warn' would not make it one.
        return f"{operation}: {not_peft.message}"
    lines = "\n".join(f"  - {f}" for f in refusals)
    if stage == "runtime":
        return (
            f"refusing {operation}() on the compiled {subject}: {len(refusals)} rule(s) "
            f"violated:\n{lines}\nFix each one, or compile with compile_peft(..., "
            "on_violation='warn') to go ahead anyway."
        )
    return (
        f"refusing to compile {subject}: {len(refusals)} rule(s) violated:\n{lines}\n"
        "Fix each one, or pass on_violation='warn' to go ahead anyway."
    )
