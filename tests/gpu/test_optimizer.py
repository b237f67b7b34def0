"""compile_optimizer on CUDA: capturable during the step, foreach chosen by torch, parity with
eager under a schedule, no recompile when the LR changes, and a resume into a plain optimizer."""

from __future__ import annotations

import copy

import pytest
import torch

from torchcompile_kit import CompileMonitor, compile_optimizer, uncompile

from .conftest import cuda_only

STEPS = 8


def _model(device):
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.GELU(), torch.nn.Linear(64, 8)).to(
        device
    )


def _run(model, opt, sched, device, steps, start=0):
    for step in range(start, start + steps):
        x = torch.randn(16, 32, generator=torch.Generator().manual_seed(step)).to(device)
        model(x).pow(2).mean().backward()
        opt.step()
        sched.step()
        opt.zero_grad()


def _build(model):
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.1)
    return opt, torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=20)


@pytest.mark.parametrize("impl", ["step", "foreach_map"])
def test_parity_no_lr_recompile_and_a_resume_into_a_plain_optimizer(device, impl):
    model, reference = _model(device), _model(device)
    opt, sched = _build(model)
    ref_opt, ref_sched = _build(reference)
    compile_optimizer(opt, impl=impl, scheduler=sched)
    with CompileMonitor() as monitor:
        _run(model, opt, sched, device, STEPS)
    _run(reference, ref_opt, ref_sched, device, STEPS)
    for p, q in zip(model.parameters(), reference.parameters()):
        torch.testing.assert_close(p, q, rtol=1e-5, atol=1e-6)
    record = monitor.record_for(opt).as_dict() if impl == "step" else monitor.as_dict()
    assert record["counts"]["recompiles"] == 0, record["counts"]  # the cosine LR changes every step
    group = opt.param_groups[0]
    assert not group.get("capturable", False) and isinstance(
        group["lr"], float
    )  # the user's, between steps
    if device.type == "cuda":
        assert all(state["step"].device.type == "cuda" for state in opt.state.values())
    # resume: the checkpoint into a plain AdamW(foreach=True), three more steps, as the reference
    state = copy.deepcopy(opt.state_dict())
    uncompile(opt)
    plain = torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.1, foreach=True)
    plain_sched = torch.optim.lr_scheduler.CosineAnnealingLR(plain, T_max=20)
    plain.load_state_dict(state)
    plain_sched.load_state_dict(sched.state_dict())
    _run(model, plain, plain_sched, device, 3, start=STEPS)
    _run(reference, ref_opt, ref_sched, device, 3, start=STEPS)
    for p, q in zip(model.parameters(), reference.parameters()):
        torch.testing.assert_close(p, q, rtol=1e-5, atol=1e-6)


def test_bf16_parameters_step_like_eager(device):
    """Pure-bf16 parameters with the float32 LR tensor on the capturable foreach path (audit C4)."""
    cuda_only(device, "capturable Adam on bf16 CUDA tensors")
    model, reference = _model(device).bfloat16(), _model(device).bfloat16()
    opt, sched = _build(model)
    ref_opt, ref_sched = _build(reference)
    compile_optimizer(opt, scheduler=sched)
    x = torch.randn(16, 32, device=device, dtype=torch.bfloat16)
    for m, o, s in ((model, opt, sched), (reference, ref_opt, ref_sched)):
        for _ in range(4):
            m(x).float().pow(2).mean().backward()
            o.step()
            s.step()
            o.zero_grad()
    for p, q in zip(model.parameters(), reference.parameters()):
        torch.testing.assert_close(p, q, rtol=2e-2, atol=2e-2)
