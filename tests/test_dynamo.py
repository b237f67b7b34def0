"""The door to torch's internals: version fallbacks, tested by switching each probe.

Only torch 2.13 can be installed here, so each fallback is exercised by making the probe answer
as an older torch would, then checking the helper that depends on it.
"""

from __future__ import annotations

import os
import sys
import warnings
from pathlib import Path

import pytest
import torch
from torch import nn
from torch._dynamo.testing import CompileCounter

from torchcompile_kit import (
    CompileMonitor,
    _dynamo,
    compile_regional,
    get_regional_plan,
    no_recompiles,
)
from torchcompile_kit._checks import check_compile_kwargs
from torchcompile_kit.regional import compile_in_place


def _old_compile(
    model=None,
    *,
    fullgraph=False,
    dynamic=None,
    backend="inductor",
    mode=None,
    options=None,
    disable=False,
):
    """torch.compile's signature before per-call recompile limits and isolated caches."""


def _new_compile(
    model=None,
    *,
    fullgraph=False,
    dynamic=None,
    backend="inductor",
    mode=None,
    options=None,
    disable=False,
    recompile_limit=None,
    isolate_recompiles=False,
):
    """torch.compile's signature with both (torch 2.13 has them; 2.8 and 2.10 do not)."""


def test_a_per_call_keyword_this_torch_lacks_is_refused_by_name():
    from torchcompile_kit.errors import UnsupportedTorchError

    with pytest.raises(
        UnsupportedTorchError,
        match=r"compile_regional\(recompile_limit=32\).*"
        + torch.__version__.replace("+", r"\+")
        + r".*config.patch",
    ):
        check_compile_kwargs(
            {"recompile_limit": 32}, caller="compile_regional", compile_fn=_old_compile
        )
    check_compile_kwargs({"recompile_limit": 32}, caller="x", compile_fn=_new_compile)
    check_compile_kwargs({"backend": "eager"}, caller="x", compile_fn=_old_compile)


@pytest.mark.skipif(
    _dynamo.recompile_limit_kwarg() is not None, reason="this torch takes recompile_limit per call"
)
def test_compile_regional_refuses_a_per_call_limit_before_compiling_anything():
    from torchcompile_kit.errors import UnsupportedTorchError

    blocks = nn.Sequential(*[IndexedBlock(i) for i in range(3)])
    with pytest.raises(UnsupportedTorchError, match="recompile_limit"):
        compile_regional(blocks, backend="eager", recompile_limit=16)
    assert _dynamo.compiled_module_names(blocks) == []


def test_per_call_keywords_are_probed_from_the_signature():
    assert _dynamo.recompile_limit_kwarg(_new_compile) == "recompile_limit"
    assert _dynamo.isolated_cache_kwarg(_new_compile) == {"isolate_recompiles": True}
    assert _dynamo.recompile_limit_kwarg(_old_compile) is None
    assert _dynamo.isolated_cache_kwarg(_old_compile) == {}


class IndexedBlock(nn.Module):
    def __init__(self, index: int):
        super().__init__()
        self.lin = nn.Linear(4, 4)
        self.index = index

    def forward(self, x):
        return self.lin(x) * (self.index + 1)


def test_a_group_with_more_variants_than_the_limit_compiles_them_all_on_every_torch():
    """12 blocks, each its own graph: the group's calls compile under a limit sized for them (24
    with evaluation), raised only while they run. It used to need torch.compile(recompile_limit=)
    (torch >= 2.13) and warned on older torches, whose last variants then ran eagerly."""
    blocks = nn.Sequential(*[IndexedBlock(i) for i in range(12)])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        compile_regional(blocks, backend="eager")
    (group,) = get_regional_plan(blocks).groups
    assert group.budget.limit == group.budget.needed == 24
    assert "recompile_limit" not in group.compile_kwargs
    with CompileMonitor() as monitor:
        blocks(torch.ones(2, 4))
        with torch.no_grad():
            blocks(torch.ones(2, 4))
    assert monitor.snapshot()["graphs"] == 24 and not monitor.limit_hits, monitor.summary()
    assert torch._dynamo.config.recompile_limit == 8  # never raised outside the group's calls


def test_torch_nn_regions_without_isolated_caches_still_compile(monkeypatch):
    monkeypatch.setattr(_dynamo, "isolated_cache_kwarg", lambda compile_fn=None: {})
    layers = [nn.Linear(4, 4) for _ in range(3)]
    counter = CompileCounter()
    compile_in_place(layers, backend=counter)
    x = torch.randn(2, 4, requires_grad=True)
    for layer in layers:
        expected = layer._call_impl(x)
        torch.testing.assert_close(layer(x), expected)
    assert counter.frame_count == 1  # one shared graph, as with isolated caches


def test_no_recompiles_bad_value_is_a_value_error_naming_it():
    match = r"on_recompile='sometimes'.*'error'.*'eager'"
    with pytest.raises(ValueError, match=match) as info, no_recompiles(on_recompile="sometimes"):
        pass
    assert type(info.value).__name__ != "BatchShapeError"


def test_fresh_inductor_cache_uses_torchs_own_switch_where_it_exists():
    with _dynamo.fresh_inductor_cache() as path:
        assert os.path.isdir(path)


def test_feature_paths_name_the_path_each_probe_takes(monkeypatch):
    paths = _dynamo.feature_paths()
    assert paths["torch"] == torch.__version__
    assert all(isinstance(v, str) and v for v in paths.values())
    monkeypatch.setattr(_dynamo.paths, "recompile_limit_kwarg", lambda: None)
    monkeypatch.setattr(_dynamo.paths, "isolated_cache_kwarg", dict)
    switched = _dynamo.feature_paths()
    assert switched["per-call recompile_limit"].startswith("refused by name")
    assert switched["isolated regions"].startswith("shared budget")


def test_a_kernel_built_while_loading_built_kernels_is_correct_without_the_precompiled_header():
    """While a compile cache's kernels load, inductor gets a plain header for its C++ prelude; a
    kernel that is built there after all (none is expected) compiles the same code without it."""

    def f(x):
        return (x.sin() * 2 + x.cos()).sum(dim=-1)

    x = torch.randn(4, 33)
    asked = _dynamo.header_precompiles()
    with _dynamo.fresh_inductor_cache(), _dynamo.loading_built_kernels():
        out = torch.compile(f, backend="inductor")(x)
    assert _dynamo.header_precompiles() == asked
    torch.testing.assert_close(out, f(x))


@pytest.mark.slow
def test_a_known_isa_answer_fills_inductors_probe_without_building_and_a_wrong_one_is_ignored():
    """A warm start or a background compile's switch takes another process's ISA answer:
    inductor's probe cache is filled with the same ISAs and compiler flags and no test library is
    built; an answer this CPU does not give exactly (another ISA, other flags) is ignored and
    inductor checks for itself, to its own answer."""
    import json
    import subprocess

    worker = str(Path(__file__).with_name("isa_probe_worker.py"))

    def run(*args):
        done = subprocess.run(
            [sys.executable, worker, *args],
            capture_output=True,
            text=True,
            timeout=600,
            check=False,
        )
        assert done.returncode == 0, done.stderr
        return json.loads(done.stdout.strip().splitlines()[-1])

    own = run("probe")
    if not own["isas"]:
        pytest.skip("inductor finds no vector ISA on this CPU")
    assert own["builds"] >= 1  # what the answer saves: inductor builds a test library per check
    primed = run("known", json.dumps(own["isas"]))
    assert primed == {"isas": own["isas"], "builds": 0}
    other_isa = own["isas"] + [["not-an-isa", ""]]
    other_flags = [[name, flags + " -mnot-a-flag"] for name, flags in own["isas"]]
    for wrong in (other_isa, other_flags):
        ignored = run("known", json.dumps(wrong))
        assert ignored == own  # inductor's own checks, every one of them, and its own answer
