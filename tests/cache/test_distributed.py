"""Two ranks (gloo on 127.0.0.1, one spawn): rank 0 writes the cache, every rank reads it."""

from __future__ import annotations

import json

import pytest

from .conftest import run_worker


@pytest.mark.slow
@pytest.mark.distributed
def test_rank0_writes_and_every_rank_reads(cold_artifact, tmp_path):
    shared = tmp_path / "shared" / "cc.tck"
    run_worker(
        "dist", str(cold_artifact[0]), str(shared), str(tmp_path), inductor_dir=tmp_path / "unused"
    )
    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1)]

    assert ranks[0]["saved"] and not ranks[1]["saved"]
    assert ranks[1]["save_reason"] == "rank 1: rank 0 writes"
    for rank in ranks:
        assert rank["loaded"], rank["load_reason"]
        assert rank["kernel_files"] > 0  # each rank filled its own empty inductor dir
        assert rank["loss"] == cold_artifact[1]["loss"]
    # rank 1 never compiled before the load: every graph came from rank 0's artifact
    assert ranks[1]["stats"]["fxgraph_cache_hit"] >= 1
    assert ranks[1]["stats"]["fxgraph_cache_miss"] == 0
    assert ranks[1]["stats"]["autograd_cache_miss"] == 0
