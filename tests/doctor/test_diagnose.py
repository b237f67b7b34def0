"""The doctor on planted problems (a wrong backward, a process that dies) and on a healthy control:
each trial in its own process, the module found and confirmed both ways, a repro that fails."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from torch import nn

from torchcompile_kit.cli import main
from torchcompile_kit.doctor import Diagnosis, diagnose
from torchcompile_kit.doctor.locate import Unit, children

from . import patients
from .patients import Patient

SPEC = "tests.doctor.patients:build"


def test_the_parts_of_a_model_group_repeated_blocks_and_split_them_by_class():
    model = Patient()
    root = Unit(label="", paths=("",), class_name="Patient")
    assert [u.describe() for u in children(model, root)] == [
        "embed (Linear)",
        "blocks.* (Block x 3)",
        "head.* (Linear x 2)",
        "head.1 (Tanh)",
    ]
    blocks = children(model, root)[1]
    below = {u.label: u.paths for u in children(model, blocks)}
    # the gate is a Gate in the last block only (an Identity, nothing to compile, elsewhere)
    assert below == {
        "blocks.*.mix": ("blocks.0.mix", "blocks.1.mix", "blocks.2.mix"),
        "blocks.*.act": ("blocks.0.act", "blocks.1.act", "blocks.2.act"),
        "blocks.2.gate": ("blocks.2.gate",),
    }


def test_a_healthy_model_is_ok_after_the_triage_alone(tmp_path):
    diagnosis = diagnose(SPEC, backend="aot_eager", out=tmp_path)
    assert diagnosis.result == "ok" and [t.label for t in diagnosis.trials] == ["triage"]
    assert diagnosis.culprits is None and diagnosis.first_bad_backend is None
    # whether it pays: both sides timed, the compile seconds, a payback or none (never a guess)
    pays = diagnosis.pays
    assert pays["eager_step_s"] > 0 and pays["compiled_step_s"] > 0 and pays["compile_s"] > 0
    assert pays["low"] <= pays["speedup"] <= pays["high"]
    assert (pays["payback_steps"] is None) == (pays["compiled_step_s"] >= pays["eager_step_s"])
    saved = json.loads((tmp_path / "doctor.json").read_text())
    assert saved["result"] == "ok" and saved["complete"] is True
    # the second batch shape recompiled (automatic dynamic), and said so
    assert any("size mismatch" in guard for guard in diagnosis.recompiles), diagnosis.recompiles


def test_a_model_whose_only_problem_is_a_graph_break_is_ok_with_the_break_named(tmp_path, capfd):
    diagnosis = diagnose("tests.doctor.patients:build_chatty", backend="aot_eager", out=tmp_path)
    assert diagnosis.result == "ok" and diagnosis.culprits is None
    found = [b for b in diagnosis.graph_breaks if not b["in_torch"]]
    text = Path(patients.__file__).read_text().splitlines()
    line = next(i for i, code in enumerate(text, 1) if "THE_BREAK" in code)
    assert found and all(b["location"].endswith(f"patients.py:{line}") for b in found), found
    assert all("print" in b["fix"] for b in found), found
    assert f"patients.py:{line}" in diagnosis.summary()


@pytest.mark.slow
def test_a_wrong_backward_in_one_module_is_found_confirmed_and_reproduced(tmp_path):
    diagnosis = diagnose(SPEC, backend="tests.doctor.patients:wrong_sigmoid_grads", out=tmp_path)
    assert diagnosis.result == "miscompute" and diagnosis.differs == ["gradients", "step"]
    assert diagnosis.first_bad_backend == "tests.doctor.patients:wrong_sigmoid_grads"
    ladder = {t.label: t.status for t in diagnosis.trials if t.label.startswith("ladder: ")}
    assert set(ladder.values()) == {"ok"} and "ladder: eager" in ladder
    assert diagnosis.culprits == ["blocks.2.gate"] and diagnosis.culprit_confirmed
    assert "blocks.2.gate" in diagnosis.workaround
    repro = subprocess.run(
        [sys.executable, diagnosis.repro], check=False, capture_output=True, text=True, timeout=600
    )
    assert repro.returncode == 1 and '"status": "miscompute"' in repro.stdout, repro.stderr[-2000:]


@pytest.mark.slow
def test_a_process_that_dies_is_a_finding_and_the_doctor_goes_on(tmp_path):
    diagnosis = diagnose(SPEC, backend="tests.doctor.patients:crashes_on_sigmoid", out=tmp_path)
    triage = diagnosis.trials[0]
    assert diagnosis.result == "crashed" and triage.signal == 8 and "SIGFPE" in triage.error
    assert diagnosis.culprits == ["blocks.2.gate"] and diagnosis.culprit_confirmed
    assert diagnosis.whole_graph_only  # its own forward holds the sigmoid, its Linear does not


def test_the_command_refuses_a_model_it_cannot_find_before_any_trial(tmp_path, capsys):
    assert main(["doctor", "--model", "nosuch_pkg:build", "--out", str(tmp_path)]) == 2
    assert "no module 'nosuch_pkg'" in capsys.readouterr().err
    assert not (tmp_path / "doctor.json").exists()


@pytest.mark.parametrize(
    ("args", "error", "match"),
    [
        ((nn.Linear(2, 2),), TypeError, r"with a module, pass the batch"),
        ((42,), TypeError, r"pass a builder spec"),
    ],
)
def test_bad_arguments_say_what_to_pass(tmp_path, args, error, match):
    with pytest.raises(error, match=match):
        diagnose(*args, out=tmp_path)


def test_a_timeout_must_be_positive(tmp_path):
    with pytest.raises(ValueError, match=r"timeout_s=0"):
        diagnose(SPEC, out=tmp_path, timeout_s=0)


def test_the_summary_names_the_rungs_and_the_culprit():
    diagnosis = Diagnosis(
        result="miscompute",
        differs=["gradients"],
        culprits=["blocks.2.gate"],
        culprit_confirmed=True,
        torch="2.13.0",
        device="cpu",
    )
    text = diagnosis.summary()
    assert text.startswith("doctor: MISCOMPUTE (gradients differ)")
    assert "blocks.2.gate: confirmed both ways" in text


@pytest.mark.slow
def test_inductors_planted_relu_bug_is_found_in_the_head_and_bisected(tmp_path):
    """A real inductor compile with its own planted accuracy bug (every ReLU kernel wrong): the
    ladder's debug rungs pass, the head's ReLU is the culprit, and torch's bisector lands on it."""
    options = {"cpp.inject_relu_bug_TESTING_ONLY": "accuracy"}
    diagnosis = diagnose(
        "tests.doctor.patients:build_relu_head",
        backend="inductor",
        compile_kwargs={"options": options},
        out=tmp_path,
    )
    assert diagnosis.result == "miscompute", diagnosis.summary()
    assert diagnosis.first_bad_backend == "inductor"
    assert diagnosis.culprits == ["head.1"] and diagnosis.culprit_confirmed, diagnosis.summary()
    assert diagnosis.bisect and diagnosis.bisect.get("backend") == "inductor", diagnosis.bisect


def test_a_module_and_its_batch_are_diagnosed_like_a_builder(tmp_path):
    """diagnose(model, batch): the module is pickled for the trials (its class importable)."""
    model = Patient()
    diagnosis = diagnose(model, patients.make_batch(0), backend="aot_eager", out=tmp_path)
    assert diagnosis.result == "ok" and (tmp_path / "model.pt").is_file()
    assert diagnosis.trials[0].status == "ok"


def test_a_healthy_model_under_bf16_autocast_is_not_called_a_miscompute(tmp_path):
    """bf16 rounding differs between eager (per op) and a fused compile: the comparator's rule,
    not a fixed tolerance, decides; a healthy model is ok (or numerics), never a culprit.

    torch 2.10 has a real bug here, and the doctor names it where it lives: under CPU autocast a
    module compiled, called under no_grad and then with grad, runs the no_grad graph again (its
    loss has no grad_fn), with backend="eager" too: a runtime error at the eager rung (dynamo,
    not inductor). Checked by hand on 2.10.0 and 2.13.0; 2.11 and 2.12 not run here."""
    diagnosis = diagnose(
        SPEC, backend="aot_eager_decomp_partition", autocast="bfloat16", out=tmp_path
    )
    release = tuple(int(part) for part in torch.__version__.split("+")[0].split(".")[:2])
    if release == (2, 10):
        assert diagnosis.result == "runtime-error", diagnosis.summary()
        assert diagnosis.first_bad_backend == "eager"
        assert "does not require grad" in diagnosis.trials[0].error
        return
    if release < (2, 13):
        pytest.skip(f"torch {torch.__version__}: the verdict is pinned for 2.10 and >= 2.13 only")
    assert diagnosis.result in ("ok", "numerics"), diagnosis.summary()
    assert diagnosis.culprits is None and len(diagnosis.trials) == 1


def _judge(bad_when):
    """A stand-in for the trial runner (locate's search is under test here, not a compiler)."""
    from torchcompile_kit.doctor import TrialOutcome

    def run(trial):
        bad = bad_when(trial.modules, trial.exclude)
        return TrialOutcome(label=trial.label, status="miscompute" if bad else "ok")

    return run


def test_the_search_descends_to_one_part_and_confirms_it_both_ways():
    from torchcompile_kit.doctor import Trial
    from torchcompile_kit.doctor.locate import locate

    gate = "blocks.2.gate"

    def bad(modules, exclude):  # wrong wherever the gate is compiled
        compiled = modules if modules is not None else [""]
        return gate not in exclude and any(gate.startswith(m) or m == "" for m in compiled)

    found = locate(Patient(), _judge(bad), Trial(label="failing"))
    assert [u.label for u in found.culprits] == [gate] and found.confirmed


def test_a_problem_that_needs_two_parts_together_is_named_as_their_parent_only():
    from torchcompile_kit.doctor import Trial
    from torchcompile_kit.doctor.locate import locate

    def bad(modules, exclude):  # the blocks fail compiled whole, never mix or act alone
        return modules is None and not exclude or bool(modules) and "blocks.0" in modules

    found = locate(Patient(), _judge(bad), Trial(label="failing"))
    assert [u.label for u in found.culprits] == ["blocks.*"]
    assert found.whole_graph_only and found.confirmed


def test_a_model_without_parts_has_no_part_to_name():
    from torchcompile_kit.doctor import Trial
    from torchcompile_kit.doctor.locate import locate

    found = locate(nn.Linear(2, 2), _judge(lambda modules, exclude: True), Trial(label="failing"))
    assert found.culprits == [] and not found.confirmed
