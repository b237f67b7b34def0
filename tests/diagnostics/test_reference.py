"""The comparator's reference: which precision, and running a model at it without disturbing it."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from torchcompile_kit.diagnostics.reference import (
    at_precision,
    autocast_active,
    cast_floating,
    casting_inputs,
    reference_dtype,
)


class Tied(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(10, 4)
        self.head = nn.Linear(4, 10, bias=False)
        self.head.weight = self.embed.weight  # tied, as LM heads are
        self.norm = nn.BatchNorm1d(4)

    def forward(self, ids):
        return self.head(self.norm(self.embed(ids).flatten(0, 1)))


def test_the_reference_is_float64_for_an_fp32_step_and_float32_for_a_low_precision_one():
    layer = nn.Linear(2, 2)
    assert reference_dtype(layer, autocast=False).dtype == torch.float64
    assert reference_dtype(layer, autocast=True).dtype == torch.float32
    assert reference_dtype(nn.Linear(2, 2).bfloat16(), autocast=False).dtype == torch.float32
    double = reference_dtype(nn.Linear(2, 2).double(), autocast=False)
    assert double.dtype is None and "float64" in double.note and "no reference" in double.describe()
    assert not autocast_active(layer)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert autocast_active(layer)


def test_at_precision_keeps_ties_and_gives_everything_back():
    model = Tied()
    model(torch.tensor([[1, 2, 3]])).sum().backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters()}
    stats = model.norm.running_mean.clone()
    pointers = {n: p.data_ptr() for n, p in model.named_parameters()}
    with at_precision(model, torch.float64), torch.autocast("cpu", dtype=torch.bfloat16):
        assert model.head.weight is model.embed.weight and model.head.weight.dtype == torch.float64
        assert all(
            p.grad is None for p in model.parameters()
        )  # set aside: a backward here is its own
        out = model(torch.tensor([[1, 2, 3]]))
        assert out.dtype == torch.float64  # autocast is off inside
        (grad,) = torch.autograd.grad(out.sum(), [model.embed.weight])
        assert grad.dtype == torch.float64
    assert {n: p.data_ptr() for n, p in model.named_parameters()} == pointers
    assert all(p.dtype == torch.float32 for p in model.parameters())
    for name, param in model.named_parameters():
        torch.testing.assert_close(param.grad, grads[name], rtol=0, atol=0)
    torch.testing.assert_close(
        model.norm.running_mean, stats, rtol=0, atol=0
    )  # the run's update went with it


def test_at_precision_gives_back_after_an_error():
    model = nn.Linear(2, 2)
    with pytest.raises(RuntimeError, match="boom"), at_precision(model, torch.float64):
        raise RuntimeError("boom")
    assert model.weight.dtype == torch.float32


def test_inputs_are_cast_with_their_strides_and_integers_kept():
    x = torch.randn(4, 6).t()  # non-contiguous
    cast = cast_floating({"x": x, "ids": torch.arange(3), "n": 2, "pair": (x, None)}, torch.float64)
    assert cast["x"].dtype == torch.float64 and cast["x"].stride() == x.stride()
    assert cast["ids"].dtype == torch.long and cast["n"] == 2 and cast["pair"][1] is None
    layer = nn.Linear(4, 2).double()
    with casting_inputs(layer, torch.float64):
        assert layer(torch.randn(3, 4)).dtype == torch.float64
    with pytest.raises(RuntimeError):  # the hook is gone
        layer(torch.randn(3, 4))
