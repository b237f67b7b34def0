"""The measured regional report agrees with dynamo's own record (issue 22).

Each test compiles a tiny model block by block, runs a training step under a ``CompileMonitor``
and compares the report, group by group, with what dynamo itself counted: graphs (a counting
backend, ``counters["stats"]["unique_graphs"]``), breaks (dynamo's graph-break log), recompiles
(cache entries per code object) and frames (``counters["frames"]``). Numbers are never taken
from the code under test; the expectations are relations to dynamo's counts.
"""

from __future__ import annotations

import math
import warnings

import pytest
import tiny_models as tm
import torch
from torch import nn
from torch._dynamo.testing import CompileCounterWithBackend
from torch._dynamo.utils import counters, get_compilation_metrics

from torchcompile_kit import CompileMonitor, _dynamo, compile_regional, get_regional_plan

from .arch_sweep import BreakLog, dynamo_record

pytestmark = pytest.mark.filterwarnings("ignore:.*loss_type=None.*")


def _run(model, steps, *, backend="aot_eager"):
    """compile_regional, then ``steps()`` under a monitor; the report and dynamo's record."""
    counters.clear()
    compile_regional(model, backend=backend)
    with BreakLog() as breaks, CompileMonitor() as monitor:
        steps(model)
    return get_regional_plan(model).report(monitor), monitor, dynamo_record(breaks)


def _assert_agrees(report, monitor, dynamo):
    summed = {
        "graphs": sum(g.graphs for g in report.groups),
        "recompiles": sum(len(g.recompiles) for g in report.groups),
        "graph_breaks": sum(g.graph_break_count for g in report.groups),
        "frames": sum(g.frames for g in report.groups),
    }
    assert summed == {k: dynamo[k] for k in summed}
    snapshot = monitor.snapshot()
    assert (snapshot["graphs"], snapshot["recompiles"], snapshot["graph_breaks_met"]) == (
        dynamo["graphs"],
        dynamo["recompiles"],
        dynamo["graph_breaks"],
    )
    for group in report.groups:  # a group that compiled is never said to have run eagerly
        assert group.graphs > 0
        assert not any("compiled nothing" in flag for flag in group.flags)


def _lm_step(model):
    model(**tm.token_batch()).loss.backward()


def test_bert_blocks_whose_forward_holds_no_op_are_credited_with_their_graph():
    # BertLayer.forward only calls submodules: no source line of it is in the graph, and the
    # frame is transformers' shared wrapper; before regions the report said "compiled nothing"
    report, monitor, dynamo = _run(tm.bert(), _lm_step)
    assert dynamo["graphs"] > 0
    _assert_agrees(report, monitor, dynamo)
    (group,) = report.groups
    assert group.class_name == "BertLayer" and group.flags == []


def test_roberta_of_the_bert_family_too():
    report, monitor, dynamo = _run(tm.roberta(), _lm_step)
    assert dynamo["graphs"] > 0
    _assert_agrees(report, monitor, dynamo)


def test_t5_encoder_and_decoder_blocks_add_up_to_dynamos_count():
    def step(model):
        batch = tm.token_batch()
        model(input_ids=batch["input_ids"], labels=batch["labels"]).loss.backward()

    report, monitor, dynamo = _run(tm.t5(), step)
    assert dynamo["graphs"] > 1  # encoder and decoder blocks differ in structure
    _assert_agrees(report, monitor, dynamo)
    (group,) = report.groups
    assert group.graphs <= group.predicted_graphs  # the preflight saw both structures


class ExpScaled(nn.Module):
    """A per-layer float read in ``forward`` through ``math.exp``: once dynamo makes the float
    symbolic (the second layer), it must restart its analysis to specialize it again
    (``TensorifyScalarRestartAnalysis``)."""

    def __init__(self, index):
        super().__init__()
        self.lin = nn.Linear(8, 8)
        self.scale = 0.1 * index

    def forward(self, x):
        return x + self.lin(x) * math.exp(self.scale) * (1 + self.scale)


class Routed(nn.Module):
    def __init__(self, index):
        super().__init__()
        self.lin = nn.Linear(8, 8)

    def forward(self, x):
        return _route(self.lin(x)) + x


def _route(x):
    if x.sum() > 0:  # data-dependent: dynamo breaks inside this callee
        return x * 2
    return x - 1


class Stack(nn.Module):
    def __init__(self, block, layers=4):
        super().__init__()
        self.layers = nn.ModuleList([block(i) for i in range(layers)])

    def forward(self, x):
        for layer in self.layers:
            x = layer(x)
        return x


def _two_steps(model):
    for _ in range(2):
        model(torch.randn(2, 8, requires_grad=True)).sum().backward()


def test_a_restarted_analysis_counts_its_graph_once():
    backend = CompileCounterWithBackend("aot_eager")
    with pytest.warns(UserWarning, match="differ in state their code uses"):
        report, monitor, dynamo = _run(Stack(ExpScaled), _two_steps, backend=backend)
    restarted = [m for m in get_compilation_metrics() if m.restart_reasons]
    assert any("Tensorify" in str(m.restart_reasons) for m in restarted)  # the case is real
    _assert_agrees(report, monitor, dynamo)
    # the backend was handed the restarted graph twice; dynamo installed it once, and so counts
    assert backend.frame_count > dynamo["graphs"] == monitor.snapshot()["graphs"]
    (group,) = report.groups
    if group.graphs >= group.predicted_graphs:  # the warning was right: it stands
        assert group.withdrawn is None and not monitor.notes


class Scaled(nn.Module):
    """A per-layer float used in ``forward``: the preflight predicts a graph per value, dynamo
    makes the float symbolic after the first recompile (measured: fewer graphs)."""

    def __init__(self, index):
        super().__init__()
        self.lin = nn.Linear(8, 8)
        self.scale = 0.8 - 0.6 * 0.7**index

    def forward(self, x):
        return x + self.lin(x) * self.scale


def test_a_warning_that_dynamo_disproved_is_withdrawn_in_the_report_and_the_monitor():
    with pytest.warns(UserWarning, match="differ in state their code uses") as warned:
        report, monitor, dynamo = _run(Stack(Scaled), _two_steps)
    _assert_agrees(report, monitor, dynamo)
    (group,) = report.groups
    assert f"compiles {group.predicted_graphs} graphs" in str(warned[0].message)
    assert 0 < dynamo["graphs"] < group.predicted_graphs  # what makes the warning wrong
    assert group.withdrawn and "withdrawn" in group.withdrawn
    assert f"dynamo compiled {dynamo['graphs']} graph(s)" in group.withdrawn
    assert group.withdrawn not in monitor.notes  # the report only reads the monitor
    assert group.withdrawn.split(": ", 1)[1] in report.summary()
    assert "withdrawn" in report.summary() and group.flags == []


def test_breaks_inside_a_callee_are_credited_to_the_block_group():
    backend = CompileCounterWithBackend("aot_eager")
    report, monitor, dynamo = _run(Stack(Routed), _two_steps, backend=backend)
    assert dynamo["graph_breaks"] > 0 and backend.frame_count == dynamo["graphs"]
    _assert_agrees(report, monitor, dynamo)
    (group,) = report.groups
    # the callee's own frames (compiled because of the break) belong to the group too
    assert {f.function for f in monitor.frames} > {"forward"}
    assert all(f.region == get_regional_plan_region(monitor) for f in monitor.frames)
    assert any("graph break" in flag for flag in group.flags)
    assert any(f"{__file__}:" in where for where in group.graph_breaks)


def get_regional_plan_region(monitor):
    (region,) = {f.region for f in monitor.frames}
    return region


def test_two_block_classes_share_one_code_object_and_their_counts_still_add_up():
    def step(model):
        labels = tm.token_batch()["input_ids"]
        model(pixel_values=torch.randn(2, 3, 32, 32), labels=labels).loss.backward()

    report, monitor, dynamo = _run(tm.vision_encoder_decoder(), step, backend="eager")
    _assert_agrees(report, monitor, dynamo)
    by_class = {g.class_name: g for g in report.groups}
    assert set(by_class) == {"ViTLayer", "GPT2Block"}
    assert by_class["ViTLayer"].shares_budget_with == ["GPT2Block"]
    # one code object: dynamo filed the second class's first graph as a recompile
    assert dynamo["recompiles"] >= 1


def test_the_recompile_limit_is_sized_for_all_classes_sharing_a_code_object():
    with torch._dynamo.config.patch(recompile_limit=3):
        model = compile_regional(tm.vision_encoder_decoder(), backend="eager")
        plan = get_regional_plan(model)
        needed = sum(2 * g.preflight.graphs for g in plan.groups)
        assert needed > 3  # each class alone fits in 3, together they do not
        assert all(2 * g.preflight.graphs <= 3 for g in plan.groups)
        assert [g.budget.limit for g in plan.groups] == [needed, needed]
        assert f"share one recompile limit: {needed} for up to {needed} graphs" in plan.summary()
        with CompileMonitor() as monitor:  # training and evaluation: every graph, no hit
            batch = {
                "pixel_values": torch.randn(2, 3, 32, 32),
                "labels": tm.token_batch()["input_ids"],
            }
            model(**batch).loss.backward()
            with torch.no_grad():
                model(**batch)
        assert not monitor.limit_hits, monitor.summary()
        assert torch._dynamo.config.recompile_limit == 3  # raised only inside the blocks' calls

    default = get_regional_plan(compile_regional(tm.vision_encoder_decoder(), backend="eager"))
    assert all("recompile_limit" not in g.compile_kwargs for g in default.groups)
    assert f"share one recompile limit: {_dynamo.recompile_limit()}" in default.summary()


def test_a_limit_the_user_set_is_kept_for_the_shared_code_object():
    if _dynamo.recompile_limit_kwarg() is None:
        pytest.skip("this torch has no per-call recompile_limit")
    with torch._dynamo.config.patch(recompile_limit=3), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = compile_regional(tm.vision_encoder_decoder(), backend="eager", recompile_limit=3)
    assert {g.compile_kwargs["recompile_limit"] for g in get_regional_plan(model).groups} == {3}


def test_an_outer_compile_traces_through_the_regions_without_a_break():
    model = compile_regional(Stack(ExpScaled, layers=2), backend="eager")
    x = torch.randn(2, 8)
    with CompileMonitor() as monitor:
        out = torch.compile(model, backend="eager", fullgraph=True)(x)
    torch.testing.assert_close(out, model(x))
    assert monitor.snapshot()["graph_breaks"] == 0


def test_a_recompile_limit_the_user_passes_is_kept_even_when_it_equals_a_groups_need():
    """The user's limit was once told apart from the preflight's by its value: a user who passed
    exactly a group's own need (2 here) was taken for the preflight and overridden."""
    if _dynamo.recompile_limit_kwarg() is None:
        pytest.skip("this torch has no per-call recompile_limit")
    with torch._dynamo.config.patch(recompile_limit=3):
        model = compile_regional(tm.vision_encoder_decoder(), backend="eager", recompile_limit=2)
    plan = get_regional_plan(model)
    assert all(g.preflight.graphs + g.preflight.eval_graphs == 2 for g in plan.groups)
    assert [g.compile_kwargs["recompile_limit"] for g in plan.groups] == [2, 2]
    assert all(g.budget.limit == 2 for g in plan.groups)


class _Gate(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.proj = nn.Linear(8, 8)

    def forward(self, x):
        x = self.proj(x)
        torch._dynamo.graph_break()  # under fullgraph=True, what dynamo cannot compile
        return torch.sigmoid(x)


class _GatedBlock(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(8)
        self.gate = _Gate()

    def forward(self, x):
        return x + self.gate(self.norm(x))


class _Encoder(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.encoder = nn.ModuleList([_GatedBlock(), _GatedBlock()])

    def forward(self, x):
        for block in self.encoder:
            x = block(x)
        return x


def test_a_compile_that_raises_names_the_module_it_was_raised_in_never_compiled_nothing():
    """fullgraph=True and a submodule dynamo cannot compile: the user's call raises torch's error,
    and the report says where, instead of "compiled nothing"."""
    model = compile_regional(_Encoder(), backend="eager", fullgraph=True)
    with CompileMonitor() as monitor, pytest.raises(Exception, match="graph_break") as raised:
        model(torch.randn(2, 8))
    assert _dynamo.compile_failure_stack(raised.value) is not None  # dynamo's own error propagated
    (group,) = get_regional_plan(model).report(monitor).groups
    assert group.failure is not None and group.flags[0].startswith("failed to compile: ")
    assert "raised in encoder.0.gate, " in group.failure and __file__ in group.failure
    assert group.failure.split(": ")[0] == type(raised.value).__name__
    assert not any("compiled nothing" in flag for flag in group.flags)
    assert "failed to compile" in get_regional_plan(model).report(monitor).summary()


@pytest.mark.parametrize("builder", [tm.gpt2, tm.llama], ids=["gpt2", "llama"])
def test_the_compiled_loss_is_a_row_and_the_rows_add_up_to_dynamos_count(builder):
    """The report said 1 graph per model where dynamo made 2: the loss compile_regional compiles
    by default had no row. A base model's loss that is never called (GPT-2's transformer) has
    none."""
    torch._dynamo.reset()  # the loss's code object is shared with earlier tests' models

    def steps(model):
        ids = torch.randint(
            0, model.config.vocab_size, (2, 8), generator=torch.Generator().manual_seed(0)
        )
        model(input_ids=ids, labels=ids).loss.backward()
        with torch.no_grad():  # evaluation: a graph of its own for the blocks and the loss
            model(input_ids=ids, labels=ids)

    report, monitor, dynamo = _run(builder(), steps)
    rows = [(g.class_name, g.blocks, g.graphs) for g in report.groups]
    assert rows[-1] == ("loss_function (ForCausalLMLoss)", 0, 2), rows
    _assert_agrees(report, monitor, dynamo)
    assert not report.flagged, report.summary()


def test_each_other_module_in_a_blocks_list_is_a_row_too():
    torch._dynamo.reset()
    counters.clear()
    others = ["transformer.wte", "transformer.wpe", "transformer.ln_f", "lm_head"]
    model = compile_regional(tm.gpt2(), backend="aot_eager", blocks=["transformer.h.*", *others])
    with BreakLog() as breaks, CompileMonitor() as monitor:
        _lm_step(model)
    report = get_regional_plan(model).report(monitor)
    rows = sorted((g.class_name, g.blocks, g.graphs) for g in report.groups if g.blocks == 1)
    assert rows == [("Embedding", 1, 1), ("Embedding", 1, 1), ("LayerNorm", 1, 1), ("Linear", 1, 1)]
    dynamo = dynamo_record(breaks)
    assert sum(g.graphs for g in report.groups) == dynamo["graphs"] == monitor.snapshot()["graphs"]
    assert sum(g.frames for g in report.groups) == dynamo["frames"]
    assert not report.flagged, report.summary()
