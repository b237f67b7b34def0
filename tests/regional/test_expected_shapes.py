"""expect_shapes: the shapes a loop feeds, told before step 1, size the graphs and the limits."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from torchcompile_kit import (
    BucketBatchSampler,
    CompileMonitor,
    compile_regional,
    expect_shapes,
    get_regional_plan,
)


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(8, 8)

    def forward(self, x):
        return x + torch.tanh(self.lin(x))


class Model(nn.Module):
    def __init__(self, layers=2):
        super().__init__()
        self.embed = nn.Linear(8, 8)  # every block's input needs a gradient: one variant
        self.layers = nn.ModuleList([Block() for _ in range(layers)])

    def forward(self, x):
        x = self.embed(x)
        for layer in self.layers:
            x = layer(x)
        return x


LENGTHS = list(range(3, 13))  # 10 shapes: over dynamo's default limit of 8 in training alone


def _loop(model):
    for length in LENGTHS:
        model(torch.randn(2, length, 8)).sum().backward()
    with torch.no_grad():
        for length in LENGTHS:
            model(torch.randn(2, length, 8))


def test_ten_shapes_in_training_and_evaluation_compile_twenty_graphs_without_a_hit():
    model = compile_regional(Model(), dynamic=False, backend="eager")
    plan = expect_shapes(model, [(2, length, 8) for length in LENGTHS])
    (group,) = plan.groups
    assert group.budget.limit == group.budget.needed == 20  # evaluation assumed alike
    assert "expected shapes: 10 in training, 10 in evaluation (assumed" in plan.summary()
    with CompileMonitor() as monitor:
        _loop(model)
    (row,) = plan.report(monitor).groups
    assert not monitor.limit_hits, monitor.summary()
    assert row.graphs == row.predicted_graphs == 20 and not row.flags, row
    assert torch._dynamo.config.recompile_limit == 8  # raised only inside the blocks' calls


def test_without_the_shapes_the_same_loop_hits_the_limit_and_the_report_says_so():
    """What expect_shapes is for: told nothing, the plan predicts one shape per mode."""
    model = compile_regional(Model(), dynamic=False, backend="eager")
    with CompileMonitor() as monitor:
        _loop(model)
    (row,) = get_regional_plan(model).report(monitor).groups
    assert monitor.limit_hits and row.predicted_graphs == 2, row
    assert any("recompile limit" in flag for flag in row.flags), row.flags


def test_a_sampler_and_evaluation_shapes_add_up_per_mode():
    model = compile_regional(Model(), dynamic=False, backend="eager")
    sampler = BucketBatchSampler([3, 5, 9, 12, 15, 16], [8, 16], batch_size=2, drop_last=True)
    expect_shapes(model, sampler)
    plan = expect_shapes(model, [(4, 8), (4, 16), (1, 16)], mode="eval")
    assert plan.expected.train == ((2, 8), (2, 16))
    assert plan.expected.evaluation == ((4, 8), (4, 16), (1, 16))
    assert plan.groups[0].budget.needed == 5
    expect_shapes(model, [(4, 8), (2, 16)], mode="eval")  # calls add up, without repeats
    assert len(plan.expected.evaluation) == 4


@pytest.mark.parametrize(("dynamic", "graphs"), [(None, 2), (True, 1), (False, 10)])
def test_the_prediction_follows_how_shapes_become_graphs(dynamic, graphs):
    """dynamic=False: a graph per shape; True: one; by default a static graph, then one dynamic
    graph per dimension that changes (the count the shapes need: dynamo may add graphs for other
    guards, which the measured report then flags)."""
    kwargs = {} if dynamic is None else {"dynamic": dynamic}
    model = compile_regional(Model(), backend="eager", **kwargs)
    plan = expect_shapes(model, [(2, length, 8) for length in LENGTHS])
    assert plan.groups[0].budget.needed == 2 * graphs  # training and evaluation
    with CompileMonitor() as monitor:
        for length in LENGTHS:
            model(torch.randn(2, length, 8)).sum().backward()
    (row,) = plan.report(monitor).groups
    assert row.predicted_graphs == graphs and not monitor.limit_hits, row


@pytest.mark.parametrize(
    ("call", "error", "match"),
    [
        (lambda m: expect_shapes(m, None), TypeError, r"shapes=None is not a BucketBatchSampler"),
        (lambda m: expect_shapes(m, 0), ValueError, r"shapes=0; pass how many"),
        (lambda m: expect_shapes(m, []), ValueError, r"shapes is empty"),
        (lambda m: expect_shapes(m, [(2, 0)]), ValueError, r"shapes\[0\] is \(2, 0\)"),
        (lambda m: expect_shapes(m, 4, mode="test"), ValueError, r"mode='test'.*'train'.*'eval'"),
        (
            lambda m: expect_shapes(Model(), 4),
            ValueError,
            r"call compile_regional\(model, \.\.\.\) first",
        ),
        (lambda m: expect_shapes("model", 4), TypeError, r"must be a torch.nn.Module"),
    ],
)
def test_bad_arguments_name_the_argument_and_the_fix(call, error, match):
    model = compile_regional(Model(), backend="eager")
    with pytest.raises(error, match=match):
        call(model)
