"""The `torchcompile-kit` command line: argument checks and their messages (nothing is run)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from torchcompile_kit.bench.recipes import RECIPES, default_recipe_names, with_dependencies
from torchcompile_kit.cli import main


def _fails(argv, capsys, match):
    try:
        status = main(argv)
    except SystemExit as exit_:  # argparse refused a flag's value
        status = exit_.code
    assert status == 2
    err = capsys.readouterr().err
    assert match in err, err


def test_list_shows_every_recipe_and_marks_opt_in(capsys):
    assert main(["bench", "--list"]) == 0
    lines = capsys.readouterr().out.splitlines()
    for name, recipe in RECIPES.items():
        (line,) = [line for line in lines if line.lstrip(" +*").startswith(f"{name} ")]
        assert line.lstrip().startswith("+") == (not recipe.default), line


def test_help_works_through_python_m():
    out = subprocess.run(
        [sys.executable, "-m", "torchcompile_kit", "bench", "--help"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert "--preset" in out and "--model" in out and "buckets" in out
    assert "--backend" not in out  # the test switch stays out of the help


def test_unknown_recipe(capsys, tmp_path):
    _fails(["bench", "nonsense", "--out", str(tmp_path)], capsys, "unknown recipe(s) ['nonsense']")


def test_unknown_preset(capsys, tmp_path):
    _fails(
        ["bench", "eager", "--preset", "huge", "--out", str(tmp_path)],
        capsys,
        "argument --preset: invalid choice: 'huge'",
    )


def test_steps_must_be_positive(capsys, tmp_path):
    _fails(
        ["bench", "eager", "--steps", "0", "--out", str(tmp_path)],
        capsys,
        "argument --steps: must be > 0, got 0",
    )


def test_unwritable_out(capsys, tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    _fails(["bench", "eager", "--out", str(blocker / "sub")], capsys, "is not a writable directory")


def test_model_that_does_not_import(capsys, tmp_path):
    _fails(
        ["bench", "eager", "--model", "no_such_module_xyz:build", "--out", str(tmp_path)],
        capsys,
        "importing 'no_such_module_xyz' failed",
    )


def test_model_that_returns_the_wrong_thing(capsys, tmp_path):
    _fails(
        [
            "bench",
            "eager",
            "--model",
            "tests.bench.user_models:returns_model_only",
            "--out",
            str(tmp_path),
        ],
        capsys,
        "must return (model, make_batch)",
    )


def test_cuda_asked_for_where_torch_sees_none(capsys, tmp_path, monkeypatch):
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    _fails(
        ["bench", "eager", "--device", "cuda", "--out", str(tmp_path / "o")],
        capsys,
        "torch sees no CUDA device here",
    )


def test_a_two_gpu_row_on_one_gpu_is_skipped_with_the_reason(monkeypatch):
    import torch

    from torchcompile_kit.bench import missing_requirement

    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    why = missing_requirement(RECIPES["ddp"], device_type="cuda", spec=None)
    assert why == "needs 2 GPUs (a process per GPU); this machine has 1"
    assert missing_requirement(RECIPES["ddp"], device_type="cpu", spec=None) is None  # gloo


def test_report_needs_a_results_file(capsys, tmp_path):
    _fails(["report", str(tmp_path)], capsys, "no results at")
    (tmp_path / "results.json").write_text('{"rows": []}')
    _fails(["report", str(tmp_path)], capsys, "is not a torchcompile-kit bench results file")


def test_default_set_and_dependencies():
    cpu = default_recipe_names(device_type="cpu")
    cuda = default_recipe_names(device_type="cuda")
    assert "reduce-overhead" not in cpu and "reduce-overhead" in cuda
    assert not any(RECIPES[name].world_size > 1 for name in cpu + cuda)  # one GPU runs them all
    # a warm recipe brings the cold one that saves its cache, and runs after it
    assert with_dependencies(["regional-warm"]) == ["regional", "regional-warm"]


@pytest.mark.parametrize("name", sorted(RECIPES))
def test_every_recipe_is_described(name):
    recipe = RECIPES[name]
    assert recipe.description and recipe.group in {"static", "dynamic", "warm-up", "distributed"}
    assert recipe.cache_from is None or RECIPES[recipe.cache_from].save_cache


def test_report_reads_every_archived_run_in_the_docs(capsys):
    """docs/results holds the runs docs/benchmarks.md quotes: report must keep reading them."""
    archive = Path(__file__).parents[2] / "docs" / "results"
    runs = sorted(path.parent for path in archive.glob("*/results.json"))
    assert runs
    for run in runs:
        assert main(["report", str(run), "--no-charts"]) == 0
        assert "== static" in capsys.readouterr().out
