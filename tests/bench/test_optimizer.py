"""The optimizer benchmark recipe runs end to end (tiny, aot_eager) and its variants agree."""

from __future__ import annotations

from torchcompile_kit.bench.optimizer import SIZES, measure, run
from torchcompile_kit.bench.timing import format_table


def test_measure_tiny_runs_every_variant_and_they_agree():
    result = measure(layers=2, width=8, rounds=1, iters=2, backend="aot_eager")
    names = [row["variant"] for row in result.rows]
    assert names == [
        "eager for-loop",
        "eager foreach",
        "eager fused",
        "compile_optimizer(step)",
        "compile_optimizer(foreach_map)",
    ]
    for row in result.rows:
        assert row["max |Δp| vs for-loop"] < 1e-5, row
        assert row["step ms"] > 0
        assert (row["compile s"] is None) == row["variant"].startswith("eager")
    assert result.config["tensors"] == 4
    assert "GPU target" in format_table(result)


def test_sizes_match_the_issue():
    full = SIZES["full"]
    assert 2 * full["layers"] == 200
    assert 0.9e6 < full["layers"] * (full["width"] ** 2 + full["width"]) < 1.1e6
    assert callable(run)
