"""The micro-benchmarks' shared pieces: text table, JSON with the environment, interleaving."""

from __future__ import annotations

import json

import pytest

from torchcompile_kit.bench.timing import BenchResult, format_table, interleaved_medians, write_json


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
    assert {"torch", "transformers", "peft", "device", "date", "git_commit"} <= set(payload["environment"])


def test_interleaved_medians_runs_every_variant_in_turn():
    calls: list[str] = []
    medians = interleaved_medians(
        {"a": lambda: calls.append("a"), "b": lambda: calls.append("b")}, rounds=2, iters=2
    )
    assert calls == ["a", "a", "b", "b", "a", "a", "b", "b"]
    assert set(medians) == {"a", "b"} and all(m >= 0 for m in medians.values())
