"""tune end to end: candidates in their own processes, the gate, the budget, the outputs."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from torchcompile_kit import _dynamo
from torchcompile_kit.bench import MeasureConfig, ModelSpecError
from torchcompile_kit.tuning import (
    TuneResult,
    check_prediction,
    format_table,
    save_result,
    tune,
)

from . import models

MODELS = Path(__file__).with_name("models.py")


def test_the_budget_is_respected_and_skips_say_why(tmp_path):
    result = tune(
        f"{MODELS}:build",
        steps_planned=1000,
        budget_s=0.5,
        candidates=["eager", "regional", "full"],
        measure=MeasureConfig(backend="eager"),
    )
    save_result(result, tmp_path)
    assert result.recommendation is None
    assert {c.status for c in result.candidates} == {"skipped"}
    assert all(c.reason.startswith("budget:") for c in result.candidates), format_table(result)
    saved = json.loads((tmp_path / "tune.json").read_text())
    assert saved["recommendation"] is None
    assert [c["name"] for c in saved["candidates"]] == ["eager", "regional", "full"]


def test_arguments_are_checked():
    with pytest.raises(ValueError, match="unknown candidate"):
        tune(f"{MODELS}:build", steps_planned=10, candidates=["turbo"])
    with pytest.raises(ValueError, match="steps_planned"):
        tune(f"{MODELS}:build", steps_planned=0)
    with pytest.raises(ModelSpecError, match="module-level function"):
        tune(lambda: models.build(), steps_planned=10)
    with pytest.raises(ModelSpecError, match="not 'module:function'"):
        tune("no_colon_here", steps_planned=10)
    with pytest.raises(ValueError, match=r"MeasureConfig\(steady_s=-1\): must be >= 0 seconds"):
        tune(f"{MODELS}:build", steps_planned=10, measure=MeasureConfig(steady_s=-1))


def test_each_candidate_is_timed_over_the_steady_window_but_never_past_the_planned_run(
    tmp_path, monkeypatch
):
    from torchcompile_kit.bench.runner import INPROCESS_ENV

    monkeypatch.setenv(INPROCESS_ENV, "1")  # no process per candidate: this is about the counts
    short = tune(
        f"{MODELS}:build",
        steps_planned=40,
        candidates=["eager"],
        measure=MeasureConfig(backend="eager", steps=3, warmup_steps=1, steady_s=60.0),
    )
    eager = short.candidate("eager")
    assert eager.status == "ok" and eager.metrics.steps == 40  # capped at the planned run
    window = tune(
        f"{MODELS}:build",
        steps_planned=10**6,
        candidates=["eager"],
        measure=MeasureConfig(backend="eager", steps=3, warmup_steps=1, steady_s=0.5),
    )
    metrics = window.candidate("eager").metrics
    assert metrics.steady_s >= 0.5 and metrics.steps >= 3
    # more than the 3 steps asked for exactly when those took less than the window
    assert (metrics.steps > 3) == (sum(metrics.step_times_s[:3]) < 0.5)
    assert window.settings["steady_s"] == 0.5


def test_the_bucket_note_describes_the_timed_buckets_row_only_when_it_ran(tmp_path, monkeypatch):
    from torchcompile_kit.bench.runner import INPROCESS_ENV

    monkeypatch.setenv(INPROCESS_ENV, "1")
    kwargs = {
        "steps_planned": 100,
        "measure": MeasureConfig(backend="eager", steps=2, warmup_steps=1),
    }
    without = tune(f"{MODELS}:build_with_lengths", candidates=["eager"], **kwargs)
    (note,) = without.notes
    assert "plan_buckets(batching=Batching(" in note and "timed 'buckets' row" not in note
    both = tune(
        f"{MODELS}:build_with_lengths",
        candidates=["eager", "buckets"],
        **kwargs,
    )
    assert both.candidate("buckets").status == "ok", format_table(both)
    (note,) = both.notes
    assert "timed 'buckets' row is your make_batch batches" in note


def test_check_prediction_runs_the_recommendation_from_a_saved_result(tmp_path, monkeypatch):
    from torchcompile_kit.bench.runner import INPROCESS_ENV

    monkeypatch.setenv(INPROCESS_ENV, "1")
    measure = MeasureConfig(backend="eager", steps=2, warmup_steps=1, steady_s=0)
    result = tune(f"{MODELS}:build", steps_planned=12, candidates=["eager"], measure=measure)
    save_result(result, tmp_path)
    saved = TuneResult.read_json(tmp_path / "tune.json")  # later, from the file alone
    check = check_prediction(saved)
    assert check.status == "ok" and check.recipe == "eager" and check.steps == 12
    assert check.measured_s > 0 and check.predicted_s == result.candidate("eager").predicted_total_s
    saved.prediction_check = check  # kept with the result: back from tune.json as a record
    saved.write_json(tmp_path / "checked.json")
    assert TuneResult.read_json(tmp_path / "checked.json").prediction_check == check
    nothing = TuneResult(
        recommendation=None, reason="nothing fit", snippet="", steps_planned=1, candidates=[]
    )
    with pytest.raises(ValueError, match="no recommendation"):
        check_prediction(nothing)


@pytest.mark.slow
def test_a_wrong_compiled_variant_is_never_recommended(tmp_path):
    # steps_planned so large that any faster compiled recipe would win on the arithmetic
    result = tune(
        f"{MODELS}:build",
        steps_planned=10**9,
        candidates=["eager", "full", "regional"],
        measure=MeasureConfig(backend=models.PERTURB_BACKEND, steady_s=0),
    )
    save_result(result, tmp_path)
    assert result.recommendation == "eager", format_table(result)
    for name in ("full", "regional"):
        candidate = result.candidate(name)
        assert candidate.status == "ok" and candidate.verdict == "fail"
        assert "against the float64 reference" in candidate.offending
    saved = json.loads((tmp_path / "tune.json").read_text())
    assert saved["recommendation"] == "eager"
    assert {c["name"]: c["verdict"] for c in saved["candidates"]} == {
        "eager": "eager",
        "full": "fail",
        "regional": "fail",
    }
    assert "computes different numbers" in result.reason
    assert (tmp_path / "tune.png").stat().st_size > 0


@pytest.mark.slow
def test_graph_breaks_are_shown_and_the_printed_snippet_reproduces_the_setup(tmp_path, monkeypatch):
    # steps_planned large enough that nothing is pruned as unable to win
    result = tune(
        f"{MODELS}:build_with_break",
        steps_planned=10**6,
        candidates=["eager", "full"],
        measure=MeasureConfig(backend="eager", steady_s=0),
    )
    save_result(result, tmp_path)
    full = result.candidate("full")
    assert full.status == "ok" and full.verdict == "pass"
    assert full.metrics.graph_breaks >= 1  # ranked, with its breaks
    table = format_table(result)
    row = next(line for line in table.splitlines() if " full " in line)
    assert f"  {full.metrics.graph_breaks}  " in row
    assert result.steps_planned == 10**6
    # the snippet runs as printed and sets up the recommended recipe
    assert (tmp_path / "recommended.py").read_text() == result.snippet
    monkeypatch.chdir(tmp_path)
    namespace: dict = {"__name__": "recommended"}  # set up only; as a script it would train
    exec(compile(result.snippet, "recommended.py", "exec"), namespace)  # noqa: S102 - the point
    compiled = _dynamo.compiled_module_names(namespace["model"])
    assert compiled == ([] if result.recommendation == "eager" else [""])
    if result.recommendation == "full":
        assert "fullgraph=False" in result.snippet  # it breaks: no fullgraph=True
    assert torch.isfinite(namespace["train_step"](namespace["make_batch"](0)))


def test_the_command_line(tmp_path, capsys):
    from torchcompile_kit.cli import main

    assert main(["tune", "--candidates", "turbo"]) == 2
    assert "unknown candidate(s) ['turbo']" in capsys.readouterr().err
    for flag, value in (("--steps-planned", "0"), ("--budget", "0"), ("--steady-seconds", "-2")):
        with pytest.raises(SystemExit) as exit_:  # argparse refuses it, naming the flag
            main(["tune", flag, value])
        assert exit_.value.code == 2
        assert f"argument {flag}: must be " in capsys.readouterr().err
    out = tmp_path / "out"
    status = main(
        [
            "tune",
            "--model",
            f"{MODELS}:build",
            "--steps-planned",
            "50",
            "--budget",
            "0.01",
            "--candidates",
            "eager",
            "full",
            "--out",
            str(out),
            "--backend",
            "eager",
        ]
    )
    assert status == 0
    saved = json.loads((out / "tune.json").read_text())
    assert saved["recommendation"] is None and saved["steps_planned"] == 50
    assert "budget:" in capsys.readouterr().err  # progress lines say why each was skipped


def test_a_small_budget_ends_with_a_compiled_candidate_checked_in_its_own_run(
    tmp_path, monkeypatch
):
    from torchcompile_kit.bench.runner import INPROCESS_ENV

    monkeypatch.setenv(INPROCESS_ENV, "1")
    result = tune(
        f"{MODELS}:build",
        steps_planned=10**6,
        budget_s=300,
        candidates=["full", "regional", "eager"],
        measure=MeasureConfig(backend="aot_eager", steps=3, warmup_steps=1, steady_s=0),
    )
    started = sorted(
        (c for c in result.candidates if c.started_s is not None), key=lambda c: c.started_s
    )
    assert [c.name for c in started] == ["eager", "regional", "full"]  # tune's order, not ours
    for name in ("regional", "full"):
        checked = result.candidate(name)
        assert checked.status == "ok" and checked.verdict == "pass", format_table(result)
        assert checked.gate_new_graphs == 0  # the run's own compiled model: no second compile
        assert checked.metrics.check["ok"] is True
    assert result.candidate(result.recommendation).eligible


USER_MODULE = """
import torch
import torch.nn.functional as F
from torch import nn


class CountingSGD(torch.optim.SGD):
    def step(self, closure=None):
        print("user optimizer step", flush=True)
        return super().step(closure)


class LM(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(32, 16)
        self.head = nn.Linear(16, 32)

    def forward(self, input_ids, labels):
        logits = self.head(self.embed(input_ids))
        return F.cross_entropy(logits.flatten(0, 1), labels.flatten())


def make_batch(step):
    ids = torch.randint(0, 32, (2, 8), generator=torch.Generator().manual_seed(step))
    return {"input_ids": ids, "labels": ids}


def build():
    torch.manual_seed(0)
    model = LM()
    return model, make_batch, None, CountingSGD(model.parameters(), lr=0.05)
"""


@pytest.mark.slow
def test_recommended_py_runs_as_a_script_from_anywhere_with_the_factorys_optimizer(
    tmp_path, monkeypatch
):
    from torchcompile_kit.bench.runner import INPROCESS_ENV

    project, out = tmp_path / "project", tmp_path / "out"
    project.mkdir()
    (project / "tck_user_models.py").write_text(USER_MODULE)
    monkeypatch.setenv(INPROCESS_ENV, "1")
    monkeypatch.chdir(project)  # where the user runs tune: the module imports from here
    monkeypatch.setattr(sys, "path", list(sys.path))  # tune puts the cwd on it
    try:
        result = tune(
            "tck_user_models:build",
            steps_planned=3,
            candidates=["eager", "full"],
            measure=MeasureConfig(backend="eager", steps=2, warmup_steps=1, steady_s=0),
        )
    finally:
        sys.modules.pop("tck_user_models", None)
    save_result(result, out)
    assert result.recommendation in ("eager", "full"), format_table(result)
    script = (out / "recommended.py").read_text()
    assert "CountingSGD" not in script and "Adam" not in script
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    # the two failures: from the out dir, and from the project dir with a path to it
    for cwd in (out, project):
        run = subprocess.run(
            [sys.executable, str(out / "recommended.py")],
            cwd=cwd,
            env=env,
            capture_output=True,
            text=True,
            timeout=300,
            check=False,
        )
        assert run.returncode == 0, run.stderr[-2000:]
        assert run.stdout.count("user optimizer step") == 3  # the factory's optimizer trained


@pytest.mark.slow
def test_two_candidates_that_run_the_same_code_are_called_indistinguishable(tmp_path, monkeypatch):
    """full and full-warm run the same compiled code: paired with eager, their ratios overlap."""
    from torchcompile_kit.bench.runner import INPROCESS_ENV

    monkeypatch.setenv(INPROCESS_ENV, "1")
    result = tune(
        "tests.bench.user_models:medium_lm",
        steps_planned=10**6,
        candidates=["eager", "full", "full-warm"],
        warm_start=True,
        measure=MeasureConfig(backend="eager", steps=60, warmup_steps=2, steady_s=0),
    )
    save_result(result, tmp_path)
    full, warm = result.candidate("full"), result.candidate("full-warm")
    assert full.status == warm.status == "ok", format_table(result)
    assert full.speedup.paired and warm.speedup.paired and full.speedup.low is not None
    assert "full-warm" in full.indistinguishable_from and "full" in warm.indistinguishable_from
    table = format_table(result)
    assert "≈" in next(line for line in table.splitlines() if " full " in line)
    saved = json.loads((tmp_path / "tune.json").read_text())
    assert {c["name"]: c["speedup"]["paired"] for c in saved["candidates"]} == {
        "eager": False,
        "full": True,
        "full-warm": True,
    }
