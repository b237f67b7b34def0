"""`bench` end to end with the cheap backend, `report`, failures as rows, and process isolation.

Recipes run in this process (``TORCHCOMPILE_KIT_BENCH_INPROCESS=1``, the documented test switch)
except in the isolation tests, which pay a process start each: the non-slow budget allows few.
"""

from __future__ import annotations

import json
import shutil

import pytest

from torchcompile_kit.bench.config import MeasureConfig
from torchcompile_kit.bench.report import restart_path
from torchcompile_kit.bench.results import load_results
from torchcompile_kit.bench.runner import INPROCESS_ENV, RunRequest, run_recipe_isolated
from torchcompile_kit.cli import main

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
METRICS = {
    "warmup_s",
    "steps_per_s",
    "tokens_per_s",
    "graphs",
    "recompiles",
    "graph_breaks",
    "padding",
    "peak_memory_mb",
    "losses",
}


@pytest.fixture
def in_process(monkeypatch):
    monkeypatch.setenv(INPROCESS_ENV, "1")


def _bench(out, *args):
    return main(
        [
            "bench",
            *args,
            "--steps",
            "2",
            "--warmup-steps",
            "1",
            "--backend",
            "eager",
            "--out",
            str(out),
        ]
    )


def test_where_a_gpu_is_visible_the_cpu_suite_still_runs_on_the_cpu(
    in_process, tmp_path, monkeypatch
):
    """On a GPU machine the suite followed the bench's device choice onto CUDA (the CUDA-graph row
    then ran instead of being skipped, the rows trained in bf16). CUDA is made to look visible
    here; $TORCHCOMPILE_KIT_BENCH_DEVICE=cpu (tests/conftest.py) keeps every row on the CPU, and
    the results still record the machine's GPU."""
    import sys
    import types

    import torch

    gpu = types.SimpleNamespace(
        name="NVIDIA H100 80GB HBM3", major=9, minor=0, multi_processor_count=132
    )
    real = torch.cuda.is_available()

    def asked_by_the_library() -> (
        bool
    ):  # torch's own checks (a CUDA build's optimizer) see the truth
        return sys._getframe(2).f_globals.get("__name__", "").startswith("torchcompile_kit")

    monkeypatch.setattr(torch.cuda, "is_available", lambda: asked_by_the_library() or real)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda index: gpu)
    out = tmp_path / "run"
    assert _bench(out, "eager", "reduce-overhead", "--preset", "tiny") == 0
    doc = load_results(out)
    rows = {row.name: row for row in doc.rows}
    assert rows["eager"].status == "ok" and rows["eager"].settings["device"] == "cpu"
    assert rows["reduce-overhead"].status == "skipped" and "CUDA" in rows["reduce-overhead"].reason
    assert doc.environment["gpu"]["sm_count"] == 132 and doc.settings["device"] == "cpu"


@pytest.mark.slow
def test_tiny_captioner_run_writes_results_charts_and_report(in_process, tmp_path, capsys):
    out = tmp_path / "run"
    assert _bench(out, "eager", "eager-longest", "reduce-overhead", "--preset", "tiny") == 0
    printed = capsys.readouterr().out
    assert "== static" in printed and "== dynamic" in printed and "reduce-overhead" in printed
    doc = load_results(out)
    rows = {row.name: row for row in doc.rows}
    assert list(rows) == ["eager", "reduce-overhead", "eager-longest"]  # table order
    assert rows["eager"].status == rows["eager-longest"].status == "ok"
    assert rows["reduce-overhead"].status == "skipped" and "CUDA" in rows["reduce-overhead"].reason
    static, longest = rows["eager"].metrics, rows["eager-longest"].metrics
    assert all(getattr(static, key) is not None for key in METRICS)  # each measured
    assert static.graphs == 0 and static.speedup.ratio == 1.0
    # the post's length mix: padding to max wastes most tokens, to the longest far fewer
    assert static.padding > 0.7 and longest.padding < static.padding
    assert len(longest.losses) == 3 and longest.loss_max_abs_diff < 1e-4  # same samples
    assert {"torch", "device", "git_commit", "date"} <= set(doc.environment)
    assert doc.settings["backend"] == "eager" and doc.settings["preset"] == "tiny"
    for chart in ("warmup.png", "throughput.png"):
        assert (out / chart).read_bytes()[:8] == PNG_MAGIC

    # report re-renders the saved file, alone and next to a second run
    (out / "warmup.png").unlink()
    assert main(["report", str(out)]) == 0
    assert "== static" in capsys.readouterr().out and (out / "warmup.png").stat().st_size > 0
    other = tmp_path / "other"
    shutil.copytree(out, other)
    data = json.loads((other / "results.json").read_text())
    data["rows"][0]["metrics"]["steps_per_s"] *= 2
    (other / "results.json").write_text(json.dumps(data))
    assert main(["report", str(out), str(other), "--markdown"]) == 0
    side = capsys.readouterr().out
    eager_line = [line for line in side.splitlines() if line.startswith("| eager |")][-1]
    assert eager_line.rstrip(" |").endswith("2.00")  # steps/s other ÷ run
    assert (out / "comparison.png").read_bytes()[:8] == PNG_MAGIC


def test_compiled_recipes_count_graphs_and_compare_losses(in_process, tmp_path):
    out = tmp_path / "run"
    assert (
        _bench(
            out,
            "eager",
            "full",
            "mark-dynamic",
            "--model",
            "tests.bench.user_models:tiny_lm",
            "--no-charts",
        )
        == 0
    )
    rows = {row.name: row for row in load_results(out).rows}
    for name in ("full", "mark-dynamic"):
        metrics = rows[name].metrics
        assert rows[name].status == "ok", rows[name].error
        assert metrics.graphs == 1 and metrics.recompiles == 0 and metrics.graph_breaks == 0
        assert metrics.loss_max_abs_diff < 1e-5 and metrics.speedup.ratio > 0


def test_the_progress_names_the_compile_only_where_a_row_compiles(
    in_process, tmp_path, monkeypatch
):
    """The eager row's set-up was labelled "compile", and a compiled row's first steps, where
    dynamo and inductor compile (up to minutes), showed only a bar that did not move."""
    from torchcompile_kit.bench import execute

    phases: list[str] = []
    emit = execute.emit_event

    def record(**event):
        if event["event"] == "phase":
            phases.append(event["phase"])
        emit(**event)

    monkeypatch.setattr(execute, "emit_event", record)
    assert (
        _bench(
            tmp_path / "run",
            "eager",
            "full",
            "--model",
            "tests.bench.user_models:tiny_lm",
            "--no-charts",
        )
        == 0
    )
    compiling = "first steps: compiling (minutes on a CPU for a large model)"
    assert phases == ["build", "set up", "build", "compile", compiling]


def test_a_failing_recipe_is_a_row_and_the_run_goes_on(in_process, tmp_path, capsys):
    out = tmp_path / "run"
    code = _bench(
        out, "full", "eager", "--model", "tests.bench.user_models:compile_hostile", "--no-charts"
    )
    assert code == 0
    rows = {row.name: row for row in load_results(out).rows}
    assert rows["full"].status == "failed"
    assert "refuses to be compiled" in rows["full"].error
    assert rows["eager"].status == "ok" and rows["eager"].metrics.steps_per_s > 0
    assert "FAILED" in capsys.readouterr().out


def test_user_model_buckets_need_the_lengths(in_process, tmp_path):
    out = tmp_path / "run"
    assert _bench(out, "buckets", "--model", "tests.bench.user_models:tiny_lm", "--no-charts") == 0
    (row,) = load_results(out).rows
    assert row.status == "skipped" and "(model, make_batch, lengths)" in row.reason
    out = tmp_path / "with-lengths"
    spec = "tests.bench.user_models:tiny_lm_with_lengths"
    assert _bench(out, "buckets", "multiple-of-32", "--model", spec, "--no-charts") == 0
    rows = {row.name: row for row in load_results(out).rows}
    assert rows["buckets"].status == rows["multiple-of-32"].status == "ok"
    assert rows["buckets"].metrics.graphs == 1  # every batch re-padded to the one bucket


@pytest.mark.slow
def test_recipe_runs_in_its_own_process_with_its_own_inductor_cache(tmp_path, monkeypatch):
    """... and its own temp dir, gone after the row: inductor keeps its precompiled C++ header
    there, which a row must not inherit from another row or an earlier run on the machine."""
    monkeypatch.delenv(INPROCESS_ENV, raising=False)
    monkeypatch.setenv("TCK_TEST_NOTE", str(tmp_path / "temp-dir.txt"))
    events = []
    spec = "tests.bench.user_models:tiny_lm_noting_its_temp_dir"
    request = RunRequest(
        recipe="mark-dynamic",
        spec=spec,
        config=MeasureConfig(steps=2, warmup_steps=1, backend="eager"),
    )
    result = run_recipe_isolated(request, out_dir=tmp_path, on_event=events.append)
    assert result.status == "ok", result.error
    assert result.metrics.graphs == 1 and result.metrics.recompiles == 0
    assert result.settings["model"] == spec
    own_temp = tmp_path / "_work" / "mark-dynamic" / "tmp"
    assert (tmp_path / "temp-dir.txt").read_text() == str(own_temp.resolve())
    assert not own_temp.exists()
    assert [e["step"] for e in events if e["event"] == "step"] == [1, 2, 3]
    request = json.loads((tmp_path / "_work" / "mark-dynamic" / "request.json").read_text())
    assert request["backend"] == "eager" and (tmp_path / "logs" / "mark-dynamic.log").is_file()


@pytest.mark.slow
def test_captioner_compiled_recipes_with_a_cheap_backend(in_process, tmp_path):
    """The post's model through dynamo: full and regional (aot_eager)."""
    out = tmp_path / "run"
    code = main(
        [
            "bench",
            "eager",
            "full",
            "regional",
            "--steps",
            "2",
            "--warmup-steps",
            "1",
            "--backend",
            "aot_eager",
            "--out",
            str(out),
            "--no-charts",
        ]
    )
    assert code == 0
    rows = {row.name: row for row in load_results(out).rows}
    for name, graphs in (("full", 1), ("regional", None)):
        assert rows[name].status == "ok", rows[name].error
        assert graphs is None or rows[name].metrics.graphs == graphs
        assert rows[name].metrics.graph_breaks == 0
        assert rows[name].metrics.loss_max_abs_diff < 1e-4


@pytest.mark.slow
def test_inductor_cold_then_warm_from_the_saved_cache(tmp_path, monkeypatch):
    """Inductor for real: the cold recipe saves the library's cache, the warm one loads it."""
    monkeypatch.delenv(INPROCESS_ENV, raising=False)
    spec = "tests.bench.user_models:tiny_lm"
    cold = run_recipe_isolated(
        RunRequest(recipe="full", spec=spec, config=MeasureConfig(steps=2, warmup_steps=1)),
        out_dir=tmp_path,
    )
    assert cold.status == "ok", cold.error
    assert cold.metrics.cache.saved is True
    warm = run_recipe_isolated(
        RunRequest(recipe="full-warm", spec=spec, config=MeasureConfig(steps=2, warmup_steps=1)),
        out_dir=tmp_path,
    )
    assert warm.status == "ok", warm.error
    assert warm.metrics.cache.loaded is True
    # the full row compiles with compile_model(precompile=True): dynamo's entry loads, no frame is
    # traced
    assert warm.metrics.regions == {"TinyLM": "precompiled (no trace)"}, warm.metrics.regions
    assert warm.metrics.monitor["frames"] == 0
    assert warm.metrics.cache.stats["dynamo_cache_hit"] == 1
    assert restart_path(warm.metrics).startswith(
        "TinyLM precompiled (no trace); the rest not re-traced"
    )
    assert warm.metrics.losses == cold.metrics.losses


@pytest.mark.slow
def test_the_regional_restart_runs_its_blocks_without_a_trace(tmp_path, monkeypatch):
    """compile_regional(precompile=True) for real: the warm row's blocks load dynamo's entries."""
    monkeypatch.delenv(INPROCESS_ENV, raising=False)
    spec, config = "tests.bench.user_models:tiny_blocks_lm", MeasureConfig(steps=2, warmup_steps=1)
    cold = run_recipe_isolated(
        RunRequest(recipe="regional", spec=spec, config=config), out_dir=tmp_path
    )
    assert cold.status == "ok", cold.error
    assert cold.metrics.regions == {"_Block": "traced (saved for the next restart)"}
    warm = run_recipe_isolated(
        RunRequest(recipe="regional-warm", spec=spec, config=config), out_dir=tmp_path
    )
    assert warm.status == "ok", warm.error
    assert warm.metrics.regions == {"_Block": "precompiled (no trace)"}
    assert warm.metrics.monitor["frames"] == 0  # nothing else is compiled in this model
    assert restart_path(warm.metrics).startswith(
        "_Block precompiled (no trace); the rest not re-traced"
    )
    assert warm.metrics.losses == cold.metrics.losses


def test_an_interrupted_run_leaves_results_that_report_renders(
    in_process, tmp_path, capsys, monkeypatch
):
    """bench used to write results.json and the charts only at the very end."""
    from torchcompile_kit.bench import runner

    real = runner.run_recipe_isolated
    calls = []

    def interrupted_at_the_third(request, **kwargs):  # the user presses Ctrl-C during recipe 3
        calls.append(request.recipe)
        if len(calls) == 3:
            raise KeyboardInterrupt
        return real(request, **kwargs)

    monkeypatch.setattr(runner, "run_recipe_isolated", interrupted_at_the_third)
    out = tmp_path / "run"
    with pytest.raises(KeyboardInterrupt):
        _bench(out, "eager", "eager-longest", "reduce-overhead", "--preset", "tiny")
    doc = load_results(out)
    assert doc.complete is False
    assert [row.name for row in doc.rows] == calls[:2]
    assert (out / "warmup.png").read_bytes()[:8] == PNG_MAGIC
    capsys.readouterr()
    assert main(["report", str(out)]) == 0
    printed = capsys.readouterr().out
    assert (
        f"PARTIAL RUN (interrupted, or still running): 2 of 3 recipes; not run: {calls[2]}"
        in printed
    )
