"""The arithmetic of tune: predicted totals, break-even steps, ranking and the reason."""

from __future__ import annotations

import math

import pytest

from torchcompile_kit.bench import BackgroundUse, Metrics
from torchcompile_kit.tuning import (
    CandidateResult,
    Cost,
    break_even_steps,
    predicted_total,
    rank_candidates,
)
from torchcompile_kit.tuning.arithmetic import cost_from_metrics
from torchcompile_kit.tuning.report import recommendation_reason

WARMUP = 5


def measured(name, *, compile_s, step_s, verdict="pass", restart=False, spikes=()):
    """A candidate as the runner would have measured it (warm-up = compile + 5 steps)."""
    return CandidateResult(
        name=name,
        description=name,
        status="ok",
        restart=restart,
        verdict="eager" if name == "eager" else verdict,
        metrics=Metrics(
            warmup_s=compile_s + WARMUP * step_s,
            warmup_steps=WARMUP,
            steps_per_s=1 / step_s,
            step_times_s=[step_s] * 20 + list(spikes),
        ),
    )


def field():
    return [
        measured("eager", compile_s=0.0, step_s=0.1),
        measured("regional", compile_s=30.0, step_s=0.05),
        measured("full", compile_s=120.0, step_s=0.04),
        # fastest of all, but it computes something else: never recommended
        measured("wrong", compile_s=1.0, step_s=0.01, verdict="fail"),
        # its run reported no check: never recommended either
        measured("unchecked", compile_s=1.0, step_s=0.01, verdict="unchecked"),
        CandidateResult(name="pruned", description="", status="pruned", reason="r"),
    ]


def test_cost_model_from_the_runners_metrics():
    cost = cost_from_metrics(
        warmup_s=12.0, warmup_steps=5, step_s=0.1, step_times_s=[0.1, 2.1, 0.1]
    )
    assert cost.compile_s == pytest.approx(11.5)
    assert cost.recompile_s == pytest.approx(2.0)  # the 2.1 s step compiled a new graph
    assert predicted_total(cost, 100) == pytest.approx(11.5 + 2.0 + 10.0)


def test_slow_batches_are_steps_not_recompiles_when_dynamo_did_not_recompile():
    times = [0.1, 0.1, 0.5, 0.1]  # a batch of long captions, in a run that compiled nothing new
    cost = cost_from_metrics(
        warmup_s=1.0, warmup_steps=5, step_s=0.1, step_times_s=times, recompiles=0
    )
    assert cost.recompile_s == 0.0
    assert cost.step_s == pytest.approx(0.2)  # the long batch comes back every so often
    one = cost_from_metrics(
        warmup_s=1.0, warmup_steps=5, step_s=0.1, step_times_s=[0.1, 2.1, 0.5, 0.1], recompiles=1
    )
    assert one.recompile_s == pytest.approx(2.1 - one.step_s)  # the largest spike is the recompile
    assert one.step_s == pytest.approx(0.7 / 3)


def test_break_even_against_eager():
    eager = Cost(compile_s=0.5, recompile_s=0.0, step_s=0.1)
    assert break_even_steps(Cost(compile_s=30.5, recompile_s=0.0, step_s=0.05), eager) == 600
    assert break_even_steps(Cost(compile_s=30.0, recompile_s=0.0, step_s=0.2), eager) == math.inf
    assert break_even_steps(Cost(compile_s=0.0, recompile_s=0.0, step_s=0.05), eager) == 0


@pytest.mark.parametrize(
    ("steps_planned", "expected"),
    [(100, "eager"), (599, "eager"), (2_000, "regional"), (10_000, "full")],
)
def test_the_run_length_decides_the_recommendation(steps_planned, expected):
    ranked, best = rank_candidates(field(), steps_planned)
    assert best.name == expected
    assert ranked[0].name == expected
    assert "wrong" not in [r.name for r in ranked[:3]]
    assert ranked[-1].name == "pruned"  # not measured: last
    regional = next(r for r in ranked if r.name == "regional")
    assert regional.break_even_steps == 600
    assert regional.predicted_total_s == pytest.approx(30.0 + steps_planned * 0.05)
    assert next(r for r in ranked if r.name == "full").break_even_steps == 2_000


def result_of(ranked, name):
    return next(c for c in ranked if c.name == name)


def test_a_tune_result_round_trips_through_tune_json(tmp_path):
    from torchcompile_kit.tuning import TuneResult

    slower = measured("slower", compile_s=10.0, step_s=0.2)  # never breaks even with eager
    ranked, best = rank_candidates([*field(), slower], 100)
    assert result_of(ranked, "slower").break_even_steps == math.inf
    result = TuneResult(
        recommendation=best.name, reason="r", snippet="s", steps_planned=100, candidates=ranked
    )
    assert TuneResult.read_json(result.write_json(tmp_path / "tune.json")) == result


def test_a_wrong_or_unchecked_candidate_is_never_recommended():
    for steps in (10, 10**9):
        _, best = rank_candidates(field(), steps)
        assert best.name not in ("wrong", "unchecked")


def test_warm_restarts_count_only_with_warm_start():
    results = field()[:3] + [measured("full-warm", compile_s=10.0, step_s=0.04, restart=True)]
    assert rank_candidates(results, 10_000)[1].name == "full"
    assert rank_candidates(results, 10_000, warm_start=True)[1].name == "full-warm"


def test_the_reason_names_the_break_even_steps():
    ranked, best = rank_candidates(field(), 2_000)
    reason = recommendation_reason(best, ranked, 2_000)
    assert reason.startswith(
        "regional: 2.00x eager per step, pays back its 30 s compile after ~600"
    )
    assert "full (2.5x per step) needs 2,000 steps" not in reason  # 2,000 is not > 2,000
    ranked, best = rank_candidates(field(), 1_500)
    reason = recommendation_reason(best, ranked, 1_500)
    assert "full (2.5x per step) needs 2,000 steps to pay back its compile time" in reason
    assert "wrong" in reason  # named as computing different numbers
    ranked, best = rank_candidates(field(), 100)
    reason = recommendation_reason(best, ranked, 100)
    # the field's 'unchecked' candidate is predicted faster than eager even at 100 steps: the
    # reason must say so rather than claim that no compiled recipe pays back
    assert reason.startswith("eager: the lowest predicted total among the recipes checked")
    assert "unchecked is predicted faster" in reason and "not checked" in reason
    checked_only = [c for c in field() if c.verdict != "unchecked"]
    ranked, best = rank_candidates(checked_only, 100)
    assert recommendation_reason(best, ranked, 100).startswith(
        "eager: no compiled recipe pays back its compile time within 100 steps"
    )


def test_the_reason_never_claims_eager_wins_when_a_faster_recipe_was_only_unchecked():
    eager = measured("eager", compile_s=0.2, step_s=0.15, verdict="eager")
    unchecked = measured("regional", compile_s=50.0, step_s=0.10, verdict="unchecked")
    ranked, best = rank_candidates([eager, unchecked], 3_000)
    assert best.name == "eager"  # an unchecked recipe is never recommended
    reason = recommendation_reason(best, ranked, 3_000)
    assert "no compiled recipe pays back" not in reason
    assert "regional is predicted faster" in reason and "not checked" in reason


def test_step_time_follows_the_planned_runs_tokens_not_the_timed_mix():
    # 30 timed steps of a heavy-tailed mix that happened to be short batches: 1 long one
    times = [0.010] * 20 + [0.014] * 9 + [0.030]
    tokens = [1000] * 20 + [1400] * 9 + [3000]
    plain = cost_from_metrics(
        warmup_s=1.0, warmup_steps=5, step_s=0.01, step_times_s=times, recompiles=0
    )
    scaled = cost_from_metrics(
        warmup_s=1.0,
        warmup_steps=5,
        step_s=0.01,
        step_times_s=times,
        step_tokens=tokens,
        plan_tokens=2000,
        recompiles=0,
    )
    assert plain.step_s == pytest.approx(sum(times) / len(times))
    assert scaled.step_s == pytest.approx(0.020, rel=1e-6)  # 10 µs per token, 0 s fixed
    assert scaled.measured_step_s == pytest.approx(plain.step_s)
    assert scaled.compile_s == pytest.approx(plain.compile_s)  # the warm-up was measured as is


@pytest.mark.parametrize(
    ("steps", "expected"),
    [
        ([(0.01, 1000)] * 5, None),  # one shape: no line
        ([(0.03, 1000), (0.02, 2000), (0.01, 3000)], None),  # slower with fewer tokens: noise
        ([(0.01, 1000), (0.02, 2000), (0.03, 3000)], 0.03),  # beyond the slowest step: capped
    ],
)
def test_step_for_tokens_trusts_a_line_only_where_there_is_one(steps, expected):
    from torchcompile_kit.tuning.arithmetic import step_for_tokens

    got = step_for_tokens(steps, 5000)
    assert got == (None if expected is None else pytest.approx(expected))


def test_a_run_that_changed_speed_is_flagged_not_taken_as_the_predictions_test():
    from torchcompile_kit.tuning.runs import run_steadiness

    # the captioner's 20,000-step verification run of this session: windows of 15 to 111 ms/step
    steady = run_steadiness([0.02] * 2000)
    assert steady.steady and "kept its speed" in steady.note
    episode = run_steadiness([0.02] * 1800 + [0.10] * 200)
    assert not episode.steady and "re-run on a quiet machine" in episode.note
    assert episode.window_ms[-1] == pytest.approx(100.0)
    assert run_steadiness([0.02] * 50) is None  # too short to cut


def paired(name, *, compile_s, step_s, ratios, restart=False):
    """A candidate whose run stepped beside eager: one block per ratio (eager's step 0.1 s)."""
    result = measured(name, compile_s=compile_s, step_s=step_s, restart=restart)
    result.metrics.paired = {
        "baseline": "eager",
        "same_batches": True,
        "base_s": [[0.1] for _ in ratios],
        "recipe_s": [[0.1 / r] for r in ratios],
    }
    return result


def test_paired_candidates_are_ranked_on_their_ratio_to_eager_with_a_margin():
    # regional's own steps were timed while the machine was loaded (0.3 s), but beside eager's
    # steps it was 1.17x: its step for the plan is eager's 0.1 s / 1.17
    results = [
        measured("eager", compile_s=0.0, step_s=0.1),
        paired(
            "regional", compile_s=30.0, step_s=0.3, ratios=[1.12, 1.15, 1.17, 1.17, 1.19, 1.22] * 3
        ),
        paired("full", compile_s=200.0, step_s=0.05, ratios=[1.02, 1.04, 1.05, 1.06, 1.08] * 3),
    ]
    ranked, best = rank_candidates(results, 100_000)
    assert best.name == "regional" and best.speedup.paired
    assert best.speedup.ratio == pytest.approx(1.17) and best.step_s == pytest.approx(0.1 / 1.17)
    assert best.speedup.low <= 1.17 <= best.speedup.high
    assert best.predicted_total_low_s < best.predicted_total_s < best.predicted_total_high_s
    assert best.indistinguishable_from == []  # 1.12-1.22 vs full's 1.02-1.08 and eager's 1.0
    reason = recommendation_reason(best, ranked, 100_000)
    assert reason.startswith(
        f"regional: 1.17x eager per step (95% interval {best.speedup.interval()})"
    )
    assert "not distinguishable" not in reason


def test_overlapping_intervals_are_called_indistinguishable():
    noisy = [0.9, 0.95, 1.0, 1.05, 1.1, 1.15, 1.2] * 2
    results = [
        measured("eager", compile_s=0.0, step_s=0.1),
        paired("full", compile_s=0.0, step_s=0.1, ratios=noisy),
        paired(
            "full-warm", compile_s=0.0, step_s=0.1, ratios=[r * 1.02 for r in noisy], restart=True
        ),
    ]
    ranked, best = rank_candidates(results, 10_000, warm_start=True)
    by_name = {c.name: c for c in ranked}
    assert "full-warm" in by_name["full"].indistinguishable_from
    assert "full" in by_name["full-warm"].indistinguishable_from
    reason = recommendation_reason(best, ranked, 10_000)
    assert "not distinguishable from" in reason and "either will do" in reason


def background(worker_s, stall_s, start_after_s=1.0):
    """A background candidate's run: eager steps, then the switch, then compiled steps."""
    return CandidateResult(
        name="regional-background",
        description="",
        status="ok",
        verdict="pass",
        metrics=Metrics(
            warmup_s=0.5,
            warmup_steps=WARMUP,
            steps_per_s=1 / 0.06,
            step_times_s=[0.1] * 300 + [0.05] * 20,
            background=BackgroundUse(
                state="compiled",
                eager_steps=300,
                switched_at_call=301,
                start_after_s=start_after_s,
                worker_s=worker_s,
                stall_s=stall_s,
            ),
        ),
    )


@pytest.mark.parametrize(
    ("steps_planned", "expected"),
    # eager 0.1 s/step, regional 30 s + 0.05 s/step; background: eager for 30 s (1 s before its
    # worker started, 29 s while it compiled), a 0.55 s stall (0.5 s beyond a compiled step), then
    # regional's steps
    [
        (100, "eager"),
        (299, "eager"),
        (400, "regional-background"),
        (100_000, "regional-background"),
    ],
)
def test_a_background_compile_is_eager_until_its_worker_is_done_then_the_compiled_recipe(
    steps_planned, expected
):
    ranked, best = rank_candidates(
        [*field()[:2], background(worker_s=29.0, stall_s=0.55)], steps_planned
    )
    assert best.name == expected
    bg = result_of(ranked, "regional-background")
    eager_total = steps_planned * 0.1
    if steps_planned < 300:  # the worker is not done yet: every step eager
        assert bg.predicted_total_s == pytest.approx(eager_total)
    else:
        assert bg.predicted_total_s == pytest.approx(30.0 + 0.5 + (steps_planned - 300) * 0.05)
    assert bg.step_s == pytest.approx(0.05)  # regional's compiled step, not its own mixed steps
    assert bg.break_even_steps == 310  # 300 eager steps, then 0.5 s won back at 0.05 s a step
    # never behind compile-then-train, and never behind eager by more than the stall
    assert bg.predicted_total_s <= result_of(ranked, "regional").predicted_total_s
    assert bg.predicted_total_s <= eager_total + 0.5 + 1e-9
