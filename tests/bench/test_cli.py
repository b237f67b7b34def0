"""The `torchcompile-kit` command line and the shared benchmark report."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from torchcompile_kit.cli import main
from torchcompile_kit.bench import RECIPES
from torchcompile_kit.bench.report import BenchResult, format_table, interleaved_medians, write_json


def test_unknown_recipe_is_refused(capsys):
    assert main(["bench", "nonsense"]) == 2
    assert "unknown recipe(s) ['nonsense']" in capsys.readouterr().err


def test_help_lists_every_recipe():
    out = subprocess.run(
        [sys.executable, "-m", "torchcompile_kit", "bench", "--help"],
        capture_output=True, text=True, check=True,
    ).stdout
    for name in RECIPES:
        assert name in out
    assert "--size" in out


def test_every_recipe_module_has_run():
    import importlib

    for module_name, _ in RECIPES.values():
        assert callable(importlib.import_module(module_name).run)


def test_table_and_json(tmp_path):
    result = BenchResult(
        recipe="demo",
        title="t",
        columns=["variant", "ms"],
        rows=[{"variant": "a", "ms": 1.23456}, {"variant": "long name", "ms": None}],
        summary=["ratio 2.0"],
    )
    lines = format_table(result).splitlines()
    assert lines[0] == "== demo: t"
    assert lines[1].index("ms") == lines[3].index("1.235") == len("long name") + 2
    assert lines[-1] == "ratio 2.0"
    payload = json.loads(write_json(tmp_path / "sub" / "r.json", [result]).read_text())
    assert payload["results"][0]["rows"][0]["ms"] == pytest.approx(1.23456)
    assert {"torch", "transformers", "peft", "device", "date", "git_commit"} <= set(
        payload["environment"]
    )


def test_interleaved_medians_runs_every_variant_in_turn():
    calls: list[str] = []
    medians = interleaved_medians(
        {"a": lambda: calls.append("a"), "b": lambda: calls.append("b")}, rounds=2, iters=2
    )
    assert calls == ["a", "a", "b", "b", "a", "a", "b", "b"]
    assert set(medians) == {"a", "b"} and all(m >= 0 for m in medians.values())
