"""The doctor's repro is free of the library (it goes into an upstream report), so it carries its
own copy of the comparator's rule (``doctor.repro.repro_judge``, written into the script). Run on
the same tensors (eager, compiled, a float64 run; healthy, rounding-level, and wrong by 1e-2 and
by 1e-6), it gives the comparator's verdict, tensor by tensor."""

from __future__ import annotations

import contextlib
import copy

import pytest
import torch
from miscompute import perturbed_backward, perturbed_forward, slightly_shifted
from torch import nn

from torchcompile_kit.diagnostics.comparator import judge_trees, leaves
from torchcompile_kit.doctor.repro import repro_judge


def _run(model, x, *, autocast: bool, backend=None, dtype=None):
    """Outputs and parameter gradients of one forward and backward."""
    model = copy.deepcopy(model)
    if dtype is not None:
        model, x = model.to(dtype), x.to(dtype)
    if backend is not None:
        torch._dynamo.reset()
        model = torch.compile(model, backend=backend)
    on = autocast and dtype is None
    with torch.autocast("cpu", dtype=torch.bfloat16) if on else contextlib.nullcontext():
        out = model(x)
    out.float().square().mean().backward()
    grads = {n.replace("_orig_mod.", ""): p.grad for n, p in model.named_parameters()}
    return {"output": out.detach(), "grad": grads}


CASES = {
    "healthy": "aot_eager",
    "forward +1e-2": perturbed_forward,
    "backward +1e-2": perturbed_backward,
    "forward +1e-6": slightly_shifted,
}


@pytest.mark.parametrize("precision", ["fp32", "bf16-autocast", "bf16-weights"])
@pytest.mark.parametrize("case", CASES)
def test_the_repro_judges_as_the_comparator_does(case, precision):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(32, 64), nn.Tanh(), nn.Linear(64, 64), nn.Tanh())
    x = torch.randn(16, 32)
    autocast = precision == "bf16-autocast"
    low = torch.bfloat16 if precision == "bf16-weights" else None
    eager = _run(model, x, autocast=autocast, dtype=low)
    compiled = _run(model, x, autocast=autocast, dtype=low, backend=CASES[case])
    exact = _run(model, x, autocast=False, dtype=torch.float64)
    library = {
        d.name: d.ok for d in judge_trees("", eager, compiled, exact, reference_dtype="float64")
    }
    repro = {
        name: not repro_judge(
            e.double(),
            dict(leaves(compiled))[name].double(),
            dict(leaves(exact))[name],
            dtype=e.dtype,
        )
        for name, e in leaves(eager)
    }
    assert repro == library
    if case != "healthy" and not (case == "forward +1e-6" and precision != "fp32"):
        assert not all(library.values())  # the wrong ones are caught (1e-6 is bf16 rounding)
    if case == "healthy":
        assert all(library.values())
