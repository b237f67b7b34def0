"""explain_graph_breaks: breaks with user file:line; the caller's compiled state untouched."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch._dynamo.testing import CompileCounter

from torchcompile_kit import CompileMonitor, _dynamo, explain_graph_breaks


def _line_of(marker: str) -> int:
    with open(__file__) as handle:
        return next(
            i for i, text in enumerate(handle, 1) if marker in text and "_line_of" not in text
        )


def noisy(x):
    x = x * 2
    print("noisy")  # PRINT_LINE
    return x + 1


def branchy(x):
    if x.sum() > 0:  # BRANCH_LINE
        return x + 1
    return x - 1


class Noisy(nn.Module):
    def forward(self, x):
        return noisy(x)


def test_breaks_have_reason_location_and_code(capsys):
    (found,) = explain_graph_breaks(noisy, torch.ones(3))
    assert "print" in found.reason
    assert (found.file, found.line) == (__file__, _line_of("# PRINT_LINE"))
    assert found.code and found.code.startswith("GB")
    assert found.function == "noisy"

    (branch,) = explain_graph_breaks(branchy, torch.ones(3))
    assert "Data-dependent branching" in branch.reason
    assert branch.line == _line_of("# BRANCH_LINE")


def test_no_break_is_an_empty_list():
    assert explain_graph_breaks(lambda x: x.sin() * 2, torch.ones(3)) == []


@pytest.mark.skipif(
    not _dynamo.isolated_cache_kwarg(),
    reason="torch < 2.13 has no isolate_recompiles: the traced frames use the caller's budget, "
    "as each break's hint says (next test)",
)
def test_callers_graphs_and_recompile_budget_are_untouched(capsys):
    counter = CompileCounter()
    step = torch.compile(noisy, backend=counter, dynamic=False)
    step(torch.ones(1))
    frames = counter.frame_count
    for _ in range(3):
        explain_graph_breaks(noisy, torch.ones(1))
    with CompileMonitor() as mon:
        step(torch.ones(1))  # still cached: no compile
        for n in range(2, 9):  # 7 new sizes: exactly the caller's budget of 8 graphs per code
            step(torch.ones(n))
    # each new size compiles again (two frames on 2.13+: before and after the print; 2.10 makes the
    # resumed frame dynamic after its second size); the monitor counts what dynamo compiled
    new = counter.frame_count - frames
    assert new >= 7
    assert mon.limit_hits == []
    assert len(mon.recompiles) == new


def test_module_compiled_in_place_is_explained_and_keeps_its_graph(capsys):
    model = Noisy()
    counter = CompileCounter()
    model.compile(backend=counter)
    model(torch.ones(2))
    frames = counter.frame_count
    (found,) = explain_graph_breaks(model, torch.ones(2))
    assert found.line == _line_of("# PRINT_LINE")
    model(torch.ones(2))
    assert counter.frame_count == frames


def test_not_callable_is_a_type_error():
    with pytest.raises(TypeError, match="expects a function or nn.Module"):
        explain_graph_breaks(42)


def test_without_isolated_caches_each_break_says_it_used_the_budget(monkeypatch):
    monkeypatch.setattr(_dynamo, "isolated_cache_kwarg", lambda compile_fn=None: {})
    breaks = explain_graph_breaks(noisy, torch.ones(2))
    assert breaks and all("used one entry of their recompile budget" in b.hints[-1] for b in breaks)


class _Chatty(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 4)

    def forward(self, x):
        print("block")  # CHATTY_PRINT
        y = self.lin(x)
        if y.sum().item() > 0:  # CHATTY_ITEM
            y = y * 2
        return y


class _ChattyStack(nn.Module):
    def __init__(self):
        super().__init__()
        self.layers = nn.ModuleList([_Chatty() for _ in range(4)])

    def forward(self, x):
        for layer in self.layers:
            x = layer(x)
        return x


@pytest.mark.parametrize("fullgraph", [False, True])
def test_a_regionally_compiled_model_lists_every_break_with_its_modules(fullgraph, capsys, recwarn):
    """It used to fire the library's own "a whole-model torch.compile is tracing it" warning, and
    with fullgraph=True blocks it raised torch's Unsupported instead of listing the break."""
    from torchcompile_kit import compile_regional, get_regional_plan

    model = compile_regional(_ChattyStack(), backend="eager", fullgraph=fullgraph)
    breaks = explain_graph_breaks(model, torch.randn(2, 4))
    lines = {b.line for b in breaks}
    assert {_line_of("CHATTY_PRINT"), _line_of("CHATTY_ITEM")} <= lines, breaks
    item = next(b for b in breaks if b.line == _line_of("CHATTY_ITEM"))
    assert item.owner == "_Chatty" and item.modules == [f"layers.{i}" for i in range(4)]
    assert not [w for w in recwarn if "whole-model torch.compile is tracing" in str(w.message)]
    # the blocks still run their regional compile afterwards (fullgraph=True: it raises, as
    # the breaks listed say it must)
    if not fullgraph:
        with CompileMonitor() as monitor:
            model(torch.randn(2, 4))
        region = get_regional_plan(model).groups[0].compiled.region
        assert any(frame.region == region for frame in monitor.frames), monitor.summary()
