"""CompileMonitor on real compiles (eager/aot_eager): breaks, recompiles, limits, seconds."""

from __future__ import annotations

import copy
import json
import logging

import pytest
import tiny_models as tm
import torch
from torch import nn

from torchcompile_kit import (
    CompileMonitor,
    _dynamo,
    compile_optimizer,
    compile_regional,
    get_regional_plan,
    no_recompiles,
)
from torchcompile_kit.errors import UnexpectedRecompileError

pytestmark = pytest.mark.filterwarnings("ignore:.*loss_type=None.*")

SNAPSHOT_KEYS = {
    "frames",
    "graphs",
    "graph_breaks",
    "recompiles",
    "compile_seconds",
    "recompile_limit_hits",
    "cache_hits",
    "cache_misses",
}


class Printing(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 4)

    def forward(self, x):
        x = self.lin(x)
        print("forward ran")  # PRINT_LINE
        return x.relu()


def _line_of(marker: str) -> int:
    with open(__file__) as handle:
        return next(
            i for i, text in enumerate(handle, 1) if marker in text and "_line_of" not in text
        )


def _summed(x):
    return x.sum() * 2


def test_print_in_forward_is_one_break_at_the_test_line(capsys):
    model = Printing()
    model.compile(backend="eager")
    with CompileMonitor() as mon:
        model(torch.randn(2, 4))
    assert len(mon.graph_breaks) == 1
    found = mon.graph_breaks[0]
    assert "print" in found.reason
    assert (found.file, found.line) == (__file__, _line_of("# PRINT_LINE"))
    assert found.code and found.code.startswith("GB")
    assert found.function == "forward"
    counts = mon.snapshot()
    assert set(counts) >= SNAPSHOT_KEYS
    assert counts["graph_breaks"] == 1 and counts["graphs"] == 2  # before and after the print
    assert f"{__file__}:{found.line}" in mon.summary()
    # both frames (forward, and forward resumed after the print) belong to the module
    assert mon.record_for(model).counts.graphs == 2
    assert [f.owner for f in mon.frames] == ["Printing", "Printing"]
    json.dumps(mon.as_dict())  # JSON-serialisable


def test_new_sizes_recompile_with_the_guard_text():
    step = torch.compile(_summed, backend="eager", dynamic=False)
    with CompileMonitor() as mon:
        step(torch.ones(4))
        step(torch.ones(6))
    assert [r.function for r in mon.recompiles] == ["_summed"]
    assert "tensor 'x' size mismatch at index 0. expected 4, actual 6" in mon.recompiles[0].reason
    assert mon.snapshot()["recompiles"] == 1 and mon.snapshot()["frames"] == 2
    assert mon.record_for(_summed).counts.recompiles == 1
    assert mon.record_for(lambda x: x).counts.frames == 0


def test_recompile_limit_hit_names_the_function_and_the_last_guard(caplog):
    step = torch.compile(_summed, backend="eager", dynamic=False)
    with caplog.at_level(logging.ERROR, logger="torch._dynamo"), CompileMonitor() as mon:
        for n in range(1, 11):  # 8 graphs, then the limit
            step(torch.ones(n))
    assert len(mon.limit_hits) == 1
    hit = mon.limit_hits[0]
    assert (hit.function, hit.limit) == ("_summed", _dynamo.recompile_limit())
    assert "expected 8, actual 9" in hit.last_reason
    assert mon.snapshot()["recompiles"] == 7 and mon.snapshot()["recompile_limit_hits"] == 1
    assert "RECOMPILE LIMIT HIT: _summed" in mon.summary()


def test_compile_seconds_are_attributed_to_the_function():
    def first(x):
        return x.cos() + 1

    step_a = torch.compile(first, backend="eager")
    step_b = torch.compile(_summed, backend="eager")
    with CompileMonitor() as mon:
        step_a(torch.ones(3))
        step_b(torch.ones(3))
    by_function = mon.seconds_by_function()
    assert set(by_function) == {
        f"first @ {__file__}:{first.__code__.co_firstlineno}",
        f"_summed @ {__file__}:{_summed.__code__.co_firstlineno}",
    }
    assert all(seconds > 0 for seconds in by_function.values())
    assert mon.snapshot()["compile_seconds"] == pytest.approx(sum(by_function.values()), abs=1e-5)


def test_nested_monitors_inner_sees_its_own_outer_sees_all():
    first = torch.compile(lambda x: x + 1, backend="eager")
    second = torch.compile(_summed, backend="eager")
    with CompileMonitor() as outer:
        first(torch.ones(2))
        with CompileMonitor() as inner:
            second(torch.ones(2))
    assert [f.function for f in inner.frames] == ["_summed"]
    assert [f.function for f in outer.frames] == ["<lambda>", "_summed"]


def test_survives_reset_and_set_logs_inside_the_block():
    step = torch.compile(_summed, backend="eager", dynamic=False)
    with CompileMonitor() as mon:
        step(torch.ones(2))
        torch._dynamo.reset()  # compile ids restart at 0/0
        torch._logging.set_logs(dynamo=logging.ERROR)
        torch._logging.set_logs()
        step(torch.ones(2))
        step(torch.ones(3))
    assert [f.compile_id for f in mon.frames] == ["0/0", "0/0", "0/1"]
    assert len(mon.recompiles) == 1 and "expected 2, actual 3" in mon.recompiles[0].reason
    assert mon.notes == []


def test_settings_and_handlers_unchanged_after_exit():
    loggers = [
        _dynamo.TRACE_LOGGER_NAME,
        _dynamo.LIMIT_WARNING_LOGGER_NAME,
        "torch",
        "torch._dynamo",
    ]

    def state():
        logs = {
            n: (
                list(logging.getLogger(n).handlers),
                logging.getLogger(n).level,
                logging.getLogger(n).propagate,
            )
            for n in loggers
        }
        return logs, torch._dynamo.config.get_config_copy()

    before = state()
    step = torch.compile(_summed, backend="eager")
    with CompileMonitor():
        step(torch.ones(2))
    assert state() == before


def test_a_logging_config_that_silences_the_trace_is_lowered_while_recording_then_restored():
    trace = logging.getLogger("torch.__trace")
    before = trace.level
    trace.setLevel(logging.WARNING)  # what a user's logging.config.dictConfig can do
    try:
        step = torch.compile(_summed, backend="eager", dynamic=False)
        with CompileMonitor() as mon:
            step(torch.ones(2))
            step(torch.ones(3))
        assert [f.function for f in mon.frames] == ["_summed", "_summed"]
        assert len(mon.recompiles) == 1 and mon.notes == []
        assert trace.level == logging.WARNING
    finally:
        trace.setLevel(before)


def test_regional_gpt2_is_one_graph_per_block_class_attributed_to_gpt2block():
    model = compile_regional(tm.gpt2(), backend="aot_eager", compile_loss=False)
    with CompileMonitor() as mon:
        model(**tm.token_batch()).loss.backward()
    # the frame is named from its marked region as it is recorded, not by the report
    assert [f.owner for f in mon.frames] == ["GPT2Block"]  # not transformers' wrapper
    before = (copy.deepcopy(mon.frames), list(mon.notes))
    report = get_regional_plan(model).report(mon)
    assert (mon.frames, mon.notes) == before  # the report only reads the monitor
    (group,) = report.groups
    assert (group.class_name, group.graphs, group.flags) == ("GPT2Block", 1, [])
    assert mon.frames[0].backward_seconds > 0
    assert "GPT2Block" in mon.summary()


def test_two_block_classes_sharing_transformers_wrapper_are_told_apart():
    # ViTLayer and GPT2Block both run through transformers' forward_with_checkpointing: one code
    # object, so the second class is a recompile of the first's code (measured here)
    model = compile_regional(tm.vision_encoder_decoder(), backend="eager")
    with CompileMonitor() as mon:
        labels = tm.token_batch()["input_ids"]
        model(pixel_values=torch.randn(2, 3, 32, 32), labels=labels).loss.backward()
    report = get_regional_plan(model).report(mon)
    assert {(g.class_name, g.graphs) for g in report.groups} == {("ViTLayer", 1), ("GPT2Block", 1)}
    assert sorted(f.owner for f in mon.frames) == ["GPT2Block", "ViTLayer"]
    assert {f.function for f in mon.frames} == {"forward_with_checkpointing"}
    assert "GPT2Block.forward (via forward_with_checkpointing)" in mon.summary()


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 4)

    def forward(self, x):
        return x + self.lin(x).relu()


class Stack(nn.Module):
    def __init__(self):
        super().__init__()
        self.blocks = nn.ModuleList([Block() for _ in range(2)])

    def forward(self, x):
        for block in self.blocks:
            x = block(x)
        return x


def test_plan_report_flags_more_graphs_than_predicted_and_groups_that_compiled_nothing():
    model = compile_regional(Stack(), backend="eager", dynamic=False)
    # block 0's input needs no grad, block 1's does (from block 0's weights): 2 graphs predicted
    assert get_regional_plan(model).groups[0].preflight.graphs == 2
    with CompileMonitor() as mon:
        model(torch.randn(2, 4))
        model(torch.randn(3, 4))  # a second shape: two more graphs
    (group,) = get_regional_plan(model).report(mon).groups
    assert group.graphs == 4 and group.predicted_graphs == 2
    assert "4 graphs where 2 were predicted" in group.flags[0]
    assert any("size mismatch at index 0" in r for r in group.recompiles)

    with CompileMonitor() as idle:
        pass
    report = get_regional_plan(model).report(idle)
    assert report.flagged and "compiled nothing" in report.groups[0].flags[0]
    json.dumps(report.as_dict())


def test_no_recompiles_error_names_function_and_guard():
    class Flagged(nn.Module):
        def forward(self, x, flag):
            return x * 2 if flag else x

    step = torch.compile(Flagged(), backend="eager")
    step(torch.ones(2), True)
    with pytest.raises(UnexpectedRecompileError) as err, no_recompiles():
        step(torch.ones(2), False)
    message = str(err.value).splitlines()[0]
    assert f"Flagged.forward ({__file__}:" in message  # the module, not only its code's name
    assert "guard 'flag == True' failed" in message


def test_record_for_optimizer_shows_the_compiled_step():
    model = nn.Linear(4, 2)
    opt = compile_optimizer(torch.optim.SGD(model.parameters(), lr=0.1), backend="eager")
    with CompileMonitor() as mon:
        for lr in (0.1, 0.05, 0.01):
            model(torch.randn(3, 4)).sum().backward()
            opt.param_groups[0]["lr"] = lr
            opt.step()
            opt.zero_grad()
    record = mon.record_for(opt)
    assert record.counts.graphs >= 1
    assert record.counts.recompiles == 0
    assert all("torch/optim" in f.file for f in record.frames)


@pytest.mark.slow
def test_cache_misses_then_hits_with_inductor():
    def fn(x):
        return (x.sin() * 2).sum()

    with _dynamo.fresh_inductor_cache():
        with CompileMonitor() as cold:
            torch.compile(fn)(torch.randn(8))
        torch._dynamo.reset()  # graphs forgotten, the on-disk caches stay
        with CompileMonitor() as warm:
            torch.compile(fn)(torch.randn(8))
    assert cold.snapshot()["cache_misses"] > 0 and cold.snapshot()["cache_hits"] == 0
    assert warm.snapshot()["cache_hits"] > 0 and warm.snapshot()["cache_misses"] == 0


def test_torch_own_graph_breaks_are_listed_apart_from_the_users():
    """torch.optim's explicit graph_break() used to be listed as a break in the user's code."""
    model = Printing()
    opt = compile_optimizer(torch.optim.Adam(model.parameters(), lr=0.1), backend="eager")
    compiled = torch.compile(model, backend="eager")
    with CompileMonitor() as mon:
        for _ in range(3):
            compiled(torch.randn(3, 4)).sum().backward()
            opt.step()
            opt.zero_grad()
    in_torch = [b for b in mon.graph_breaks if b.in_torch]
    assert in_torch and all("torch/optim" in b.file for b in in_torch), mon.summary()
    summary = mon.summary()
    user_part, torch_part = summary.split("graph breaks in torch's own code")
    assert f"test_monitor.py:{_line_of('PRINT_LINE')}" in user_part.split("graph breaks (user")[1]
    assert "torch/optim" not in user_part.split("graph breaks (user")[1]
    assert "torch/optim" in torch_part
    assert f"({sum(b.count for b in in_torch)} in torch's own code)" in summary.splitlines()[0]


def test_a_recompile_names_every_earlier_graphs_failed_guard():
    """A new length after a frozen and a trainable variant: the size guard is named too.

    The summary used to show only the most recent graph's failed guard (``requires_grad``).
    """
    layer = nn.Linear(4, 4)
    step = torch.compile(lambda x: layer(x).sum(), backend="eager", dynamic=False)
    with CompileMonitor() as mon:
        step(torch.ones(2, 4))
        layer.weight.requires_grad_(False)
        step(torch.ones(2, 4))
        layer.weight.requires_grad_(True)
        step(torch.ones(3, 4))
    last = mon.recompiles[-1]
    assert "size mismatch at index 0. expected 2, actual 3" in last.guard, last.guard
    # every earlier graph's own failed guard is named (torch >= 2.13 keeps a frozen variant:
    # 2 earlier graphs; torch 2.10 reuses the first graph for it: 1)
    assert len(last.reasons) == len(mon.frames) - 1, (last.reasons, mon.frames)
    # both earlier graphs refused the new length on its size: named once, not once per graph
    assert last.guard.count("size mismatch") == 1, last.guard


def test_a_recompile_names_the_guard_that_failed_for_it_once_not_every_bucket_again():
    """8 bucket lengths, dynamic=False: the 7th recompile's line used to hold 7 size guards."""
    step = torch.compile(lambda x: (x * 2).sum(), backend="eager", dynamic=False)
    with CompileMonitor() as mon:
        for length in range(8, 72, 8):
            step(torch.ones(2, length))
    assert len(mon.recompiles) == 7, mon.summary()
    last = mon.recompiles[-1]
    assert len(last.reasons) == 7, last.reasons
    assert last.guard.count("size mismatch") == 1, last.guard
    assert "expected 56, actual 64" in last.guard and "(and 6 earlier graphs alike)" in last.guard
    assert mon.summary().count("size mismatch") == 7  # one per recompile line


def test_logging_disable_is_said_in_the_notes_not_silently_an_empty_record():
    logging.disable(logging.CRITICAL)
    try:
        with CompileMonitor() as mon:
            torch.compile(_summed, backend="eager")(torch.ones(2))
    finally:
        logging.disable(logging.NOTSET)
    # torch >= 2.13 keeps its trace on under logging.disable(); where it does not, a note says so
    assert len(mon.frames) == 1 or "logging.disable()" in mon.notes[0]
