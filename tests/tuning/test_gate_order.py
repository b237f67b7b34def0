"""The gate runs inside the budget: a candidate that leads is checked before the next measurement."""

from __future__ import annotations

import pytest

from torchcompile_kit.tuning import CandidateResult, rank_candidates, tuner
from torchcompile_kit.tuning.gate import GateVerdict

WARMUP = 5


def measured(name, *, compile_s, step_s, verdict="unchecked"):
    return CandidateResult(
        name=name, recipe=name, description=name, status="ok",
        verdict="eager" if name == "eager" else verdict,
        metrics={
            "warmup_s": compile_s + WARMUP * step_s, "warmup_steps": WARMUP,
            "steps_per_s": 1 / step_s, "step_times_s": [step_s] * 20,
        },
    )


@pytest.fixture
def checked(monkeypatch):
    """Which candidates the gate checked, in order (the check itself is tests/tuning/test_gate.py's)."""
    calls: list[str] = []

    def fake_check(candidate, **kwargs):
        calls.append(candidate.name)
        return GateVerdict(ok=candidate.name != "full", offending=None if candidate.name != "full" else "x")

    monkeypatch.setattr(tuner, "check_candidate", fake_check)
    monkeypatch.setattr(tuner, "_model_and_batch", lambda *a: None)
    return calls


def gate(left=lambda: 1e9):
    return tuner._Gate(
        {c.name: c for c in tuner.CANDIDATES}, None, "tiny", "eager", "cpu", left, lambda e: None
    )


def test_a_leading_candidate_is_checked_at_once_and_a_losing_one_waits(checked):
    results = [measured("eager", compile_s=0.0, step_s=0.10), measured("regional", compile_s=30, step_s=0.05)]
    rank_candidates(results, 10_000)
    g = gate()
    g.check_leaders(results, 10_000, warm_start=False)
    assert checked == ["regional"] and results[1].verdict == "pass"
    # full is predicted slower than the checked regional: not checked now ...
    results.append(measured("full", compile_s=120, step_s=0.09))
    rank_candidates(results, 10_000)
    g.check_leaders(results, 10_000, warm_start=False)
    assert checked == ["regional"]
    # ... but at the end, while the budget lasts; it fails, and regional's verdict is reused
    g.check_all(results)
    assert checked == ["regional", "full"] and results[2].verdict == "fail"


def test_a_leader_that_fails_hands_the_lead_to_the_next(checked):
    results = [
        measured("eager", compile_s=0.0, step_s=0.10),
        measured("full", compile_s=10, step_s=0.04),
        measured("regional", compile_s=30, step_s=0.05),
    ]
    rank_candidates(results, 10_000)
    gate().check_leaders(results, 10_000, warm_start=False)
    assert checked == ["full", "regional"]
    _, best = rank_candidates(results, 10_000)
    assert best.name == "regional"


def test_without_budget_for_the_check_the_candidate_stays_unchecked_with_the_reason(checked):
    results = [measured("eager", compile_s=0.0, step_s=0.10), measured("regional", compile_s=30, step_s=0.05)]
    rank_candidates(results, 10_000)
    gate(left=lambda: 10.0).check_leaders(results, 10_000, warm_start=False)
    assert checked == []
    assert results[1].verdict == "unchecked" and results[1].reason.startswith("not checked:")
    _, best = rank_candidates(results, 10_000)
    assert best.name == "eager"
