"""Regional and whole-model compile on CUDA: the first-call check in fp32 and under bf16
autocast, training that follows eager, CUDA-graph modes refused per block and right over the
whole model, and the upstream bug behind the refusal."""

from __future__ import annotations

import contextlib
import copy

import pytest
import tiny_models as tm
import torch

from torchcompile_kit import compile_model, compile_regional
from torchcompile_kit.errors import UnsafeCompileModeError

from .conftest import cuda_only

STEPS = 3


def _ids(device, step=0):
    return torch.randint(0, tm.VOCAB, (4, 16), generator=torch.Generator().manual_seed(step)).to(
        device
    )


def _losses(model, device, *, bf16=False, steps=STEPS):
    """SGD steps of ``model`` (under bf16 autocast if asked); the loss of each."""
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    losses = []
    for step in range(steps):
        ids = _ids(device, step)
        autocast = (
            torch.autocast(device.type, dtype=torch.bfloat16) if bf16 else contextlib.nullcontext()
        )
        with autocast:
            loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        opt.step()
        opt.zero_grad()
        losses.append(loss.item())
    return losses


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
@pytest.mark.parametrize("recipe", ["regional", "model"])
def test_the_first_call_check_passes_and_training_follows_eager(device, recipe, precision):
    """The check compares the first compiled call with eager (the comparator's rounding bound
    under bf16); a false CompiledMismatchError here would refuse a healthy run."""
    torch.manual_seed(0)
    model = tm.gpt2(n_layer=2, n_embd=64).to(device)
    eager = copy.deepcopy(model)
    (compile_regional if recipe == "regional" else compile_model)(model, verify=True)
    bf16 = precision == "bf16"
    compiled, reference = _losses(model, device, bf16=bf16), _losses(eager, device, bf16=bf16)
    tolerance = 2e-2 if bf16 else 1e-4
    assert compiled == pytest.approx(reference, rel=tolerance), (compiled, reference)


def test_cuda_graphs_per_block_are_refused_at_the_call_and_after_a_move(device):
    cuda_only(device, "a model on CUDA")
    model = tm.gpt2().to(device)
    with pytest.raises(UnsafeCompileModeError, match="152887"):
        compile_regional(model, mode="reduce-overhead")
    moved = compile_regional(tm.gpt2(), mode="reduce-overhead").to(device)  # compiled, then moved
    with pytest.raises(UnsafeCompileModeError, match="152887"):
        moved(input_ids=_ids(device))


def test_plain_per_block_cuda_graphs_in_a_training_loop(device):
    """Plain ``block.compile(mode="reduce-overhead")`` for every block of a GPT-2, trained: what
    the refusal keeps users from. Measured on an H100 (torch 2.11, 2026-11-27): no error and
    eager's losses in this loop; pytorch#152887's pattern (a block's output read after the next
    block's replay: hidden states kept, hooks, residuals outside the blocks) is what breaks, and the
    library cannot rule it out, so the refusal stays. Prints how many graphs cudagraph trees
    skipped (a skipped graph runs without CUDA graphs)."""
    cuda_only(device, "CUDA graphs")
    from torch._dynamo.utils import counters

    torch.manual_seed(0)
    model = tm.gpt2(n_layer=2, n_embd=64).to(device)
    eager = copy.deepcopy(model)
    for block in model.transformer.h:
        block.compile(mode="reduce-overhead")
    compiled = _losses(model, device, steps=4)
    reference = _losses(eager, device, steps=4)
    print(
        "per-block CUDA graphs: losses",
        compiled,
        "eager",
        reference,
        "cudagraph_skips",
        counters["inductor"]["cudagraph_skips"],
    )
    assert compiled == pytest.approx(reference, rel=1e-4)


def test_cuda_graphs_over_the_whole_model_train_like_eager_with_the_first_call_check(device):
    """The supported shape (the bench's reduce-overhead row); the check runs the compiled call
    a second time under cudagraph trees (audit B3)."""
    torch.manual_seed(0)
    model = tm.gpt2(n_layer=2, n_embd=64).to(device)
    eager = copy.deepcopy(model)
    compile_model(model, mode="reduce-overhead", verify=True)
    assert _losses(model, device, steps=4) == pytest.approx(
        _losses(eager, device, steps=4), rel=1e-4
    )
