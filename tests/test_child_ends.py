"""One reading of a child process's end (``torchcompile_kit/_child.py``): a child killed by
SIGKILL and a child that hangs are reported in the same words by the bench, the doctor's
trials, its repro check and the background worker (tests/regional/test_background.py)."""

from __future__ import annotations

import pytest

from torchcompile_kit._child import ChildEnd, log_tail

KILLED = "the process died with signal 9 (SIGKILL)"
HUNG = "the process had not ended after"


def test_the_words_of_each_end_and_the_log_tail(tmp_path):
    log = tmp_path / "child.log"
    log.write_text("loading\nTraceback (most recent call last):\n  File x.py\nValueError: bad\n")
    assert ChildEnd.of(-9).describe() == KILLED
    assert ChildEnd.of(1, log).describe() == "the process exited 1: ValueError: bad"
    assert ChildEnd.of(0, log).ok and ChildEnd.of(0, log).tail == ""
    assert ChildEnd.timed_out(2.5).describe() == f"{HUNG} 2.5 s (a hang?) and was stopped"
    log.write_text("x" * 2000)
    assert len(log_tail(log)) == 804 and log_tail(tmp_path / "missing.log") == ""


def test_the_repro_check_reads_a_killed_and_a_hung_script_alike(tmp_path):
    from torchcompile_kit.doctor.repro import check_repro

    killed = tmp_path / "killed.py"
    killed.write_text("import os, signal\nos.kill(os.getpid(), signal.SIGKILL)\n")
    hung = tmp_path / "hung.py"
    hung.write_text("import time\ntime.sleep(600)\n")
    dead = check_repro(killed, timeout_s=60)
    assert dead.fails and KILLED in dead.output, dead
    stuck = check_repro(hung, timeout_s=2)
    assert stuck.fails and f"{HUNG} 2 s" in stuck.output, stuck


def test_the_doctors_trials_read_a_killed_and_a_hung_trial_alike(tmp_path):
    from tests.doctor import patients
    from torchcompile_kit.doctor import Trial
    from torchcompile_kit.doctor.runner import TrialRunner

    runner = TrialRunner(tmp_path, patients.trial_inputs(tmp_path), timeout_s=10)
    try:
        dead = runner.run(Trial(label="killed", backend="tests.child_cases:killed_backend"))
        stuck = runner.run(Trial(label="hangs", backend="tests.doctor.patients:hangs"))
    finally:
        runner.close()
    assert dead.status == "crashed" and dead.signal == 9 and dead.error.startswith(KILLED), dead
    assert stuck.status == "timeout" and stuck.error.startswith(f"{HUNG} 10 s"), stuck


@pytest.mark.slow
@pytest.mark.parametrize(("spec", "said"), [("killed", KILLED), ("hung", HUNG)])
def test_the_bench_reads_a_killed_and_a_hung_recipe_alike(tmp_path, monkeypatch, spec, said):
    from torchcompile_kit.bench import MeasureConfig
    from torchcompile_kit.bench.runner import INPROCESS_ENV, RunRequest, run_recipe_isolated

    monkeypatch.delenv(INPROCESS_ENV, raising=False)
    request = RunRequest(
        recipe="eager",
        spec=f"tests.child_cases:{spec}",
        config=MeasureConfig(steps=1, warmup_steps=1, backend="eager"),
    )
    result = run_recipe_isolated(request, out_dir=tmp_path, timeout_s=30)
    assert result.status == "failed" and result.error.startswith(said), result.error
    assert result.stopped_after_s == (30 if spec == "hung" else None)  # what tune's budget reads
