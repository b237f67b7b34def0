"""Two ranks (gloo on 127.0.0.1, one spawn): each rank writes and reads an artifact of its own."""

from __future__ import annotations

import json

import pytest

from .conftest import run_worker


@pytest.mark.slow
@pytest.mark.distributed
def test_each_rank_writes_and_reads_its_own_artifact(cold_artifact, tmp_path):
    """On GPUs inductor keys each graph on its device index, so rank 0's artifact misses on every
    other rank (pytorch#108971); here rank 1 compiles other graphs than rank 0 (another batch
    size) to stand for that, and still starts warm from its own artifact. With one artifact
    written by rank 0 it missed every graph."""
    shared = tmp_path / "shared" / "cc.tck"
    run_worker(
        "dist", str(cold_artifact[0]), str(shared), str(tmp_path), inductor_dir=tmp_path / "unused"
    )
    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1)]

    assert ranks[0]["saved"] and ranks[1]["saved"], [r["save_reason"] for r in ranks]
    assert ranks[0]["saved_path"] == ranks[0]["loaded_path"] == str(shared)
    assert (
        ranks[1]["saved_path"] == ranks[1]["loaded_path"] == str(shared.with_name("cc.rank1.tck"))
    )
    for rank in ranks:
        assert rank["loaded"], rank["load_reason"]
        assert rank["kernel_files"] > 0  # each rank filled its own empty inductor dir
        # every graph of the restart came from the rank's own artifact
        assert rank["stats"]["fxgraph_cache_hit"] >= 1
        assert rank["stats"]["fxgraph_cache_miss"] == 0
        assert rank["stats"]["autograd_cache_miss"] == 0
    assert ranks[0]["loss"] == cold_artifact[1]["loss"]
