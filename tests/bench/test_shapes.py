"""The `bench shapes` recipe runs and its bucketed schemes meet the no-recompile contract."""

from __future__ import annotations

import pytest

from torchcompile_kit.bench.shapes import run, seed_length_mix
from torchcompile_kit.bench.timing import format_table


def test_seed_length_mix_has_the_documented_proportions():
    lengths = seed_length_mix(20000, seed=3)
    short = sum(5 <= n <= 31 for n in lengths) / len(lengths)
    middle = sum(33 <= n <= 63 for n in lengths) / len(lengths)
    assert abs(short - 0.90) < 0.01 and abs(middle - 0.09) < 0.01
    assert min(lengths) >= 5 and max(lengths) <= 255


@pytest.mark.slow
def test_small_run_reports_every_scheme():
    result = run(size="small")
    rows = {row["scheme"]: row for row in result.rows}
    assert len(rows) == len(result.rows) >= 8
    for name, row in rows.items():
        if "BucketBatchSampler" in name or "sampler" in name:
            assert row["recompiles"] == 0 and row["eager fallback"] == "no"
            assert row["shapes"] <= 8
    assert rows["pad-to-longest, dynamic=False, random batches"]["eager fallback"].startswith("yes")
    assert rows["pad-to-longest + mark_dynamic_batch, random batches"]["graphs"] == 1
    assert "shapes" in format_table(result)
    with pytest.raises(ValueError, match="size must be"):
        run(size="huge")
