"""Marked regions: the monitor credits what dynamo compiles to the region whose call ran."""

from __future__ import annotations

import logging

import torch
from torch import nn

from torchcompile_kit import CompileMonitor, _dynamo, uncompile
from torchcompile_kit.diagnostics import current_region, mark_region
from torchcompile_kit.diagnostics.recorder import TraceRecorder


class Seen(nn.Module):
    """Records the region running while its forward runs (eagerly: dynamo skips the call)."""

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 4)
        self.seen: list[str | None] = []

    @torch.compiler.disable
    def note(self):
        self.seen.append(current_region())

    def forward(self, x):
        self.note()
        return self.lin(x)


def test_a_region_is_current_only_inside_its_compiled_call_and_goes_with_uncompile():
    a, b = Seen(), Seen()
    for module in (a, b):
        module.compile(backend="eager")
    first, second = mark_region([a], "Seen"), mark_region([b], "Seen")
    assert first != second and first.startswith("Seen")
    with CompileMonitor() as mon:
        a(torch.ones(2, 4))
        b(torch.ones(3, 4))  # one code object: a new shape is a recompile, inside b's region
    assert (a.seen, b.seen, current_region()) == ([first], [second], None)
    assert [f.region for f in mon.frames if f.graphs] == [first, second]
    assert mon.record_for_region(second).counts.recompiles == len(mon.recompiles) == 1
    uncompile(a)
    a(torch.ones(2, 4))
    assert a.seen[-1] is None and not _dynamo.is_compiled_module(a)


def _record(name, value, *, attempt=0, payload=None):
    record = logging.LogRecord("torch.__trace", logging.DEBUG, __file__, 1, "", None, None)
    record.metadata = {name: value, "frame_id": 0, "frame_compile_id": 0, "attempt": attempt}
    record.payload = payload
    return record


def test_a_graph_of_an_attempt_dynamo_restarted_is_not_counted():
    recorder = TraceRecorder()
    start = {"stack": [{"name": "forward", "filename": -1, "line": 3}]}
    metrics = {
        "co_name": "forward",
        "co_filename": "m.py",
        "co_firstlineno": 3,
        "compile_id": "0/0",
        "graph_op_count": 2,
    }
    for record in (
        _record("dynamo_start", start),
        _record("dynamo_output_graph", {}, attempt=0),  # discarded by the restart
        _record("dynamo_output_graph", {}, attempt=1),
        _record("compilation_metrics", metrics, attempt=1),
    ):
        recorder.emit(record)
    assert [f.graphs for f in recorder.frames] == [1]
    assert recorder.unreadable == 0


def test_the_first_compiled_call_of_each_block_is_logged_before_and_after(caplog):
    """A plain loop's cold first step used to run for minutes with no output."""
    import logging

    import tiny_models as tm
    import torch

    from torchcompile_kit import compile_regional

    model = compile_regional(tm.gpt2(), backend="aot_eager")
    batch = tm.token_batch()
    with caplog.at_level(logging.INFO, logger="torchcompile_kit.diagnostics.regions"):
        model(**batch).loss.backward()
        first = [r.getMessage() for r in caplog.records]
        caplog.clear()
        with torch.no_grad():
            model(**batch)
    starts = [m for m in first if "first compiled call: dynamo compiles it now" in m]
    ends = [m for m in first if "first compiled call done in" in m]
    # each block, and the loss compile_regional compiles (a region of its own)
    labels = ["GPT2Block", "GPT2Block", "loss_function (ForCausalLMLoss)"]
    assert [m.split("#")[0] for m in starts] == [m.split("#")[0] for m in ends] == labels
    assert not caplog.records  # later calls log nothing
