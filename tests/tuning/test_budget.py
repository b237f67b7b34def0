"""A small budget: tune measures the most promising candidates first, each checked in its own run,
and when no compiled candidate fits it says what budget would.

The runner is replaced by one that advances a fake clock by what each run would take (start-up,
compile, steady steps), so these are the decisions, not timings.
"""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest

from torchcompile_kit.bench import MeasureConfig, Metrics, RecipeResult
from torchcompile_kit.tuning import budget as budget_module
from torchcompile_kit.tuning import runs as runs_module
from torchcompile_kit.tuning import tune

SPEC = f"{Path(__file__).with_name('models.py')}:build"
START_S, STEADY_S, STEP_S = 5.0, 30.0, 0.1
COMPILE_S = {"eager": 0.0, "regional": 20.0, "full": 40.0, "mark-dynamic": 60.0}


@pytest.fixture
def runner(monkeypatch):
    """Replaces the runner; returns the recipes it was asked to run, in order."""
    now = [0.0]
    clock = SimpleNamespace(perf_counter=lambda: now[0])
    monkeypatch.setattr(budget_module, "time", clock)
    monkeypatch.setattr(runs_module, "time", clock)
    calls: list[str] = []

    def run(request, *, timeout_s, on_event, **_):
        recipe, check = request.recipe, request.check
        calls.append(recipe)
        compiled_at = START_S + COMPILE_S[recipe]
        total = compiled_at + STEADY_S
        on_event({"event": "phase", "phase": "compile"})
        if timeout_s is not None and timeout_s < total:
            if timeout_s > compiled_at:
                now[0] += compiled_at
                on_event({"event": "step", "step": 2, "total": 300, "phase": "steady"})
                now[0] += timeout_s - compiled_at
            else:
                now[0] += timeout_s
            return RecipeResult(
                name=recipe,
                status="failed",
                error=f"the process had not ended after {timeout_s:g} s (a hang?) and was stopped",
                stopped_after_s=timeout_s,
            )
        now[0] += total
        # compiled candidates run twice as fast per step as eager
        step = STEP_S if recipe == "eager" else STEP_S / 2
        metrics = Metrics(
            warmup_s=COMPILE_S[recipe] + step,
            warmup_steps=1,
            steps_per_s=1 / step,
            step_times_s=[step] * int(STEADY_S / step),
            steady_s=STEADY_S,
        )
        if check is not None:
            metrics.check = {"ok": True, "offending": None, "seconds": 0.5, "new_graphs": 0}
        return RecipeResult(name=recipe, status="ok", wall_s=total, metrics=metrics)

    monkeypatch.setattr(runs_module, "run_recipe_isolated", run)
    return calls


def run_tune(budget_s):
    return tune(
        SPEC,
        steps_planned=10**6,
        budget_s=budget_s,
        candidates=["mark-dynamic", "full", "regional", "eager"],
        measure=MeasureConfig(backend="eager"),
    )


def test_a_small_budget_goes_to_the_cheapest_compile_first_and_it_is_checked(runner):
    result = run_tune(budget_s=100)  # eager (35 s) + regional (55 s) fit; full (75 s) does not
    assert runner == ["eager", "regional"]
    regional = result.candidate("regional")
    assert regional.status == "ok" and regional.verdict == "pass" and regional.gate_new_graphs == 0
    assert result.recommendation == "regional"
    assert result.candidate("full").reason.startswith("budget:")
    assert "no compiled candidate finished" not in result.reason


def test_when_the_budget_stops_the_first_compile_tune_says_what_budget_would_do(
    runner, monkeypatch
):
    monkeypatch.setitem(COMPILE_S, "regional", 50.0)
    result = run_tune(budget_s=80)  # eager takes 35 s; regional is stopped 45 s in, compiling
    assert runner == ["eager", "regional"]
    assert result.recommendation == "eager"
    assert result.candidate("regional").verdict == "unchecked"
    # 35 s before it + more than its 45 s + eager's 30 s of steady steps: more than 110 s
    assert (
        "regional was still compiling when the budget stopped it 45 s into its run" in result.reason
    )
    assert "needs more than 1.8 min" in result.reason
    assert "--budget 2 or more (budget_s=110)" in result.reason
    assert result.reason.startswith("eager: the only recipe measured")


def test_a_run_stopped_while_timing_steps_gives_the_budget_it_needed(runner):
    result = run_tune(budget_s=75)  # regional compiled 25 s into its run, stopped at 40 s
    assert runner == ["eager", "regional"]
    # 35 s before it + 25 s to compile + 30 s of steady steps
    assert "regional had compiled (after 25 s) and was timing steps when stopped" in result.reason
    assert "needs about 1.5 min" in result.reason and "--budget 2 (budget_s=90)" in result.reason


def test_a_compile_that_cannot_start_gives_a_lower_bound(runner):
    result = run_tune(budget_s=60)  # 25 s left after eager, whose run took 35 s: none starts
    assert runner == ["eager"]
    assert "regional could not start" in result.reason
    # 35 s spent + a run at least as long as eager's
    assert "needs more than 1.2 min" in result.reason and "(budget_s=70)" in result.reason


def test_without_a_budget_every_candidate_runs_in_tunes_order(runner):
    result = run_tune(budget_s=None)
    assert runner == ["eager", "regional", "full", "mark-dynamic"]
    assert {c.name: c.verdict for c in result.candidates} == {
        "eager": "eager",
        "regional": "pass",
        "full": "pass",
        "mark-dynamic": "pass",
    }


def test_a_candidate_that_cannot_run_starts_no_process(runner):
    result = tune(
        SPEC,
        steps_planned=10**6,
        candidates=["regional-warm", "eager"],
        measure=MeasureConfig(backend="eager"),
    )
    assert runner == ["eager"]
    warm = result.candidate("regional-warm")
    assert warm.status == "skipped" and "needs the compile cache of 'regional'" in warm.reason
    assert warm.started_s is None


def test_without_out_dir_tune_leaves_no_directory_behind(runner, monkeypatch, tmp_path):
    monkeypatch.setattr("tempfile.tempdir", str(tmp_path))
    run_tune(budget_s=None)
    assert list(tmp_path.iterdir()) == []
