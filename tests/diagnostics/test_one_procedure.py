"""One procedure for "compiled = eager?": the first-call check, ``check_compile_equivalence``,
``compile_optimizer``'s first-step check and tune's gate, given the same model and step, reach the
same verdict against the same reference and name the same worst tensor (with dropout the verdict
and the reference: check_compile_equivalence runs it off), in fp32, with bf16 weights, under bf16
autocast, with dropout, and with a planted miscompute
(``torchcompile_kit/diagnostics/compare.py`` is the procedure all of them go through).
"""

from __future__ import annotations

import contextlib
import copy
import re

import pytest
import torch
from miscompute import perturbed_backward, perturbed_updates
from torch import nn

from torchcompile_kit import (
    CompileMonitor,
    EquivalenceStep,
    check_compile_equivalence,
    compile_model,
    compile_optimizer,
)
from torchcompile_kit.bench import RECIPES
from torchcompile_kit.errors import CompiledMismatchError
from torchcompile_kit.tuning.gate import check_candidate


class Net(nn.Module):
    def __init__(self, dropout: float = 0.0) -> None:
        super().__init__()
        self.up = nn.Linear(16, 32)
        self.drop = nn.Dropout(dropout)
        self.down = nn.Linear(32, 1)

    def forward(self, x, y):
        out = self.down(self.drop(torch.tanh(self.up(x)))).squeeze(-1)
        return {"loss": nn.functional.mse_loss(out.to(y.dtype), y)}  # a reference casts both


# name -> (weights' dtype, autocast, dropout, backend of the model's compile)
SETTINGS = {
    "fp32": (torch.float32, False, 0.0, "aot_eager"),
    "bf16-weights": (torch.bfloat16, False, 0.0, "aot_eager"),
    "bf16-autocast": (torch.float32, True, 0.0, "aot_eager"),
    "dropout": (torch.float32, False, 0.1, "aot_eager"),
    "planted": (torch.float32, False, 0.0, perturbed_backward),
    "planted-bf16-weights": (torch.bfloat16, False, 0.0, perturbed_backward),
    "planted-bf16-autocast": (torch.float32, True, 0.0, perturbed_backward),
    "planted-dropout": (torch.float32, False, 0.1, perturbed_backward),
}


def model_and_batch(setting: str):
    dtype, _, dropout, _ = SETTINGS[setting]
    torch.manual_seed(0)
    model = Net(dropout).to(dtype).train()
    gen = torch.Generator().manual_seed(1)
    batch = {"x": torch.randn(8, 16, generator=gen).to(dtype), "y": torch.randn(8, generator=gen)}
    return model, batch


def autocast(setting: str):
    on = SETTINGS[setting][1]
    return torch.autocast("cpu", dtype=torch.bfloat16) if on else contextlib.nullcontext()


def reference_of(described: str) -> str:
    """'float64', 'float32' or 'not needed' from a record's or a report's reference."""
    return "not needed" if described.startswith("not needed") or not described else described


def tensor_of(name: str) -> str:
    """A tensor's name without the check's own prefix (a step label, ``update.``)."""
    return re.sub(r"^(\d+:train\.)", "", name)


def first_call_check(setting: str) -> tuple[bool, str, str]:
    model, batch = model_and_batch(setting)
    compile_model(model, backend=SETTINGS[setting][3], verify=True)
    with CompileMonitor() as monitor, autocast(setting):
        try:
            model(**batch)["loss"].backward()
        except CompiledMismatchError as error:
            record = error.record
        else:
            (record,) = monitor.first_call_checks
    return record.status == "passed", reference_of(record.reference), tensor_of(record.worst)


def equivalence(setting: str) -> tuple[bool, str, str]:
    model, batch = model_and_batch(setting)
    with autocast(setting):
        report = check_compile_equivalence(
            model, steps=[EquivalenceStep.train(batch)], backend=SETTINGS[setting][3]
        )
    reference = report.reference.name if report.reference.needed else "not needed"
    # the train step compares the loss, the gradients and the parameters after one SGD step:
    # the first-call check compares the output (the loss) and the gradients
    worst = max(
        (d for d in report.diffs if not d.name.split(".", 2)[1].startswith("param")),
        key=lambda d: d.ratio,
    )
    return report.ok, reference, tensor_of(worst.name)


@pytest.mark.parametrize("setting", SETTINGS)
def test_the_first_call_check_and_check_compile_equivalence_agree(setting):
    ok, reference, worst = first_call_check(setting)
    assert (ok, reference) == equivalence(setting)[:2]
    if not ok and SETTINGS[setting][2] == 0:  # the tensor a user is told about
        # (with dropout the two steps differ: the first-call check draws eager's masks in your
        # call, check_compile_equivalence turns dropout off, so their worst tensors may differ)
        assert worst == equivalence(setting)[2]
    assert ok is not setting.startswith("planted")
    # healthy: aot_eager computes what eager computes, bit for bit, so no reference was needed;
    # a miscompute is judged against float64, or float32 for 16-bit weights or autocast
    expected = "not needed" if ok else "float32" if "bf16" in setting else "float64"
    assert reference == expected


# --- an optimizer step: compile_optimizer's check and tune's gate --------------------------------


def _optimizer_step_checks(setting: str, backend) -> tuple[tuple[bool, str], tuple[bool, str]]:
    model, batch = model_and_batch(setting)
    reference = copy.deepcopy(model)

    def adamw(m):
        return torch.optim.AdamW(m.parameters(), lr=1e-2, weight_decay=0.01)

    # compile_optimizer(verify=True): its first compiled step (the second: state exists then)
    optimizer = compile_optimizer(adamw(model), backend=backend, verify=True)
    with CompileMonitor() as monitor:
        for _ in range(2):
            model(**batch)["loss"].backward()
            try:
                optimizer.step()
            except CompiledMismatchError as error:
                record = error.record
                break
            optimizer.zero_grad()
        else:
            (record,) = monitor.first_call_checks
    in_place = (record.status == "passed", reference_of(record.reference))
    # tune's gate on a run that compiled the same optimizer
    run_model = copy.deepcopy(reference)
    run_optimizer = compile_optimizer(adamw(run_model), backend=backend)
    run_model(**batch)["loss"].backward()
    run_optimizer.step()  # the state exists: the gate's steps run compiled
    verdict = check_candidate(
        RECIPES["compile-optimizer"],
        model=run_model,
        reference=reference,
        batch=batch,
        optimizer=run_optimizer,
        backend="eager",
    )
    found = re.search(r"reference: ([^)]*)\)$", verdict.summary)
    gate = (verdict.ok, reference_of(found[1]) if found else "?")
    return in_place, gate


@pytest.mark.parametrize(
    ("setting", "backend"),
    [("fp32", "eager"), ("bf16-weights", "eager"), ("planted", perturbed_updates)],
)
def test_compile_optimizers_check_and_tunes_gate_agree(setting, backend):
    in_place, gate = _optimizer_step_checks(setting, backend)
    assert in_place == gate
    assert in_place[0] is (setting != "planted")
    if setting == "bf16-weights":
        assert in_place[1] == "float32"  # the one rule: 16-bit tensors against float32
