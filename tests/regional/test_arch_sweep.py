"""The architecture sweep over a sample, each type in a fresh process (slow: ~2-4 min).

The full sweep (every type transformers can build tiny) runs on demand:
``python tests/regional/arch_sweep.py --all --out sweep.jsonl``; its table is in
``docs/regional.md``.
"""

from __future__ import annotations

import pytest

from .arch_sweep import SAMPLE, run_in_subprocess


@pytest.mark.slow
@pytest.mark.parametrize("model_type", SAMPLE)
def test_report_equals_dynamos_record(model_type):
    row = run_in_subprocess(model_type, timeout=600)
    assert row["stage"] == "done", row.get("error")
    assert row["equal"], f"compiled differs from eager by {row['max_diff']}"
    summed = {key: sum(g[key] for g in row["groups"]) for key in ("graphs", "recompiles", "breaks")}
    dynamo = row["dynamo"]
    assert summed == {
        "graphs": dynamo["graphs"],
        "recompiles": dynamo["recompiles"],
        "breaks": dynamo["graph_breaks"],
    }
    assert row["snapshot_equals_dynamo"], (row["snapshot"], dynamo)
    assert not row["compiled_nothing_wrongly"]
    if model_type == "jetmoe":  # the sample's case of breaks inside the blocks' callees
        assert dynamo["graph_breaks"] > 0
