"""Paired ratios, their interval and the marks, on synthetic data (no timing, no model)."""

from __future__ import annotations

import dataclasses
import itertools
import random

import pytest
import torch

from torchcompile_kit.bench.metrics import compare, measure_training
from torchcompile_kit.bench.outcome import Metrics, RecipeResult, Speedup
from torchcompile_kit.bench.paired import (
    MIN_BLOCKS,
    NEIGHBOUR_LIMIT,
    CpuSnapshot,
    cpu_snapshot,
    merge_repeats,
    neighbour_share,
    not_quotable,
    paired_ratio,
    ratio_interval,
)
from torchcompile_kit.bench.recipes import RECIPES


def _blocks(ratio, n, *, load=lambda i: 1.0, noise=0.0, seed=0):
    """(baseline, recipe) seconds of ``n`` blocks: the recipe ``ratio`` times faster, both sides
    of block ``i`` slowed by ``load(i)``, each side with a little independent noise."""
    rng = random.Random(seed)
    base = [0.02 * load(i) * (1 + rng.uniform(-noise, noise)) for i in range(n)]
    recipe = [0.02 / ratio * load(i) * (1 + rng.uniform(-noise, noise)) for i in range(n)]
    return base, recipe


def test_load_that_hits_both_sides_of_a_block_leaves_the_ratio_alone():
    # a neighbour switching on and off every 3 blocks makes both sides 3x slower meanwhile
    base, recipe = _blocks(1.2, 30, load=lambda i: 3.0 if (i // 3) % 2 else 1.0)
    r = ratio_interval(base, recipe)
    assert (
        r.ratio == pytest.approx(1.2)
        and r.low == pytest.approx(1.2)
        and r.high == pytest.approx(1.2)
    )
    # what dividing two runs measured at different moments says: quiet eager, loaded recipe
    assert base[0] / recipe[3] == pytest.approx(0.4)


def test_the_interval_covers_the_ratio_and_narrows_with_more_blocks():
    few = ratio_interval(*_blocks(1.1, 10, noise=0.1))
    many = ratio_interval(*_blocks(1.1, 200, noise=0.1))
    for r in (few, many):
        assert r.low <= r.ratio <= r.high and r.low < 1.1 < r.high
        assert r.method == "median of block ratios, bootstrap"
    assert many.high - many.low < few.high - few.low
    assert (
        ratio_interval(*_blocks(1.1, 10, noise=0.1)) == few
    )  # seeded: the same blocks, the same interval


def test_a_minority_of_one_sided_hits_does_not_move_the_median():
    base, recipe = _blocks(1.5, 40)
    for i in range(0, 40, 5):  # one block in five has only its recipe side slowed 3x
        recipe[i] *= 3
    assert ratio_interval(base, recipe).ratio == pytest.approx(1.5)
    assert sum(base) / sum(recipe) < 1.2  # a ratio of totals would be dragged down


def test_other_batches_use_the_ratio_of_totals():
    # the recipe's batches vary in size block by block (buckets); the baseline's do not
    base = [0.04] * 20
    recipe = [0.01 if i % 2 else 0.03 for i in range(20)]
    r = ratio_interval(base, recipe, same_batches=False)
    assert r.ratio == pytest.approx(2.0) and r.method.startswith("ratio of totals")
    assert r.low <= 2.0 <= r.high


def test_too_few_blocks_have_no_interval_and_are_marked():
    r = ratio_interval([0.02] * (MIN_BLOCKS - 1), [0.01] * (MIN_BLOCKS - 1))
    assert r.ratio == 2.0 and r.low is None and r.high is None
    (reason,) = not_quotable(Metrics(speedup=Speedup(ratio=2.0, blocks=4)))
    assert "too few" in reason and "--steps" in reason


def test_bad_blocks_are_refused():
    with pytest.raises(ValueError, match="as many baseline as recipe"):
        ratio_interval([0.1, 0.1], [0.1])
    with pytest.raises(ValueError, match="positive"):
        ratio_interval([0.1, 0.0], [0.1, 0.1])


def test_marks_say_why():
    quiet = Metrics(
        speedup=Speedup(ratio=1.2, low=1.15, high=1.25, blocks=20, paired=True),
        cpu_neighbours=0.02,
        cpu_neighbours_steady=0.03,
        cpu_steal=0.0,
    )
    assert not_quotable(quiet) == []
    loaded = dataclasses.replace(quiet, cpu_neighbours_steady=0.31)
    assert not_quotable(loaded) == [
        "other processes used 31% of the machine's CPU during it (limit 10%)"
    ]
    wide = dataclasses.replace(quiet, speedup=Speedup(ratio=1.2, low=0.9, high=1.5, blocks=20))
    assert "spans 50% of the ratio" in not_quotable(wide)[0]
    stolen = dataclasses.replace(quiet, cpu_steal=0.12)
    assert "hypervisor took 12%" in not_quotable(stolen)[0]
    assert not_quotable(Metrics()) == []  # nothing measured, nothing to say


def test_neighbour_share_is_the_machine_minus_this_process_tree():
    before = CpuSnapshot(busy_s=100.0, total_s=1000.0, own_s=50.0)
    # 10 s of 2 CPUs: the machine ran 12 CPU-s, this process 9 of them: 3 of 20 were others'
    after = CpuSnapshot(busy_s=112.0, total_s=1020.0, own_s=59.0)
    assert neighbour_share(before, after) == pytest.approx(0.15)
    assert neighbour_share(before, before) is None and neighbour_share(None, after) is None
    # clock ticks can make the difference slightly negative: never below 0
    assert neighbour_share(before, CpuSnapshot(busy_s=101.0, total_s=1010.0, own_s=51.5)) == 0.0


def test_a_live_snapshot_counts_this_process():
    first = cpu_snapshot()
    x = 0
    for i in range(2_000_000):
        x += i
    second = cpu_snapshot()
    assert second.own_s > first.own_s and second.total_s > first.total_s
    assert 0.0 <= neighbour_share(first, second) <= 1.0


def test_measure_training_alternates_blocks_on_the_same_batches():
    calls = []

    def side(name):
        return lambda batch: calls.append((name, int(batch["i"]))) or torch.tensor(1.0)

    def stream():
        return ({"i": torch.tensor(i)} for i in itertools.count())

    metrics = measure_training(
        side("R"),
        stream(),
        warmup_steps=2,
        steps=6,
        device=torch.device("cpu"),
        baseline=lambda: (side("B"), stream()),
        block_steps=2,
    )
    timed = calls[4:]  # after the recipe's and the baseline's 2 warm-up steps each
    assert calls[:4] == [("R", 0), ("R", 1), ("B", 0), ("B", 1)]
    assert [name for name, _ in timed] == list("RRBBBBRRRRBB")  # the order swaps every block
    assert sorted(i for name, i in timed if name == "R") == sorted(
        i for name, i in timed if name == "B"
    )
    paired = metrics.paired
    assert paired["block_steps"] == 2 and len(paired["base_s"]) == len(paired["recipe_s"]) == 3
    assert len(metrics.step_times_s) == 6 and len(metrics.losses) == 8  # the recipe's only


def _row(name, steps_per_s, paired=None, **extra):
    metrics = Metrics(steps_per_s=steps_per_s, warmup_s=1.0, losses=[1.0], paired=paired, **extra)
    return RecipeResult(name=name, status="ok", metrics=metrics)


def test_compare_takes_the_paired_ratio_not_the_rows_measured_apart():
    base, recipe = _blocks(1.02, 20, noise=0.02)
    rows = [
        _row("eager", 4.0, cpu_neighbours=0.02),  # measured while the machine was loaded ...
        _row(
            "full",
            16.0,
            {"baseline": "eager", "base_s": base, "recipe_s": recipe, "same_batches": True},
            cpu_neighbours=0.3,
        ),  # ... and this one while it was not: 4x by division
    ]
    compare(rows, RECIPES)
    full = rows[1].metrics
    speedup = full.speedup
    assert speedup.ratio == pytest.approx(1.02, rel=0.03) and speedup.paired is True
    assert speedup.low <= speedup.ratio <= speedup.high and speedup.blocks == 20
    assert full.not_quotable and rows[0].metrics.not_quotable == []
    assert rows[0].metrics.speedup.ratio == 1.0


def test_repeats_pool_their_blocks_and_keep_each_run():
    def run(ratio, neighbours, warmup):
        base, recipe = _blocks(ratio, 10, noise=0.05, seed=int(100 * ratio))
        return RecipeResult(
            name="full",
            status="ok",
            metrics=Metrics(
                warmup_s=warmup,
                steps_per_s=10.0,
                step_times_s=[0.1] * 10,
                cpu_neighbours=neighbours,
                paired={
                    "baseline": "eager",
                    "base_s": base,
                    "recipe_s": recipe,
                    "same_batches": True,
                },
            ),
        )

    merged = merge_repeats([run(1.2, 0.0, 30.0), run(1.25, 0.5, 90.0), run(1.2, 0.01, 31.0)])
    assert len(merged.metrics.paired["base_s"]) == 30 and merged.metrics.steps == 30
    assert merged.metrics.warmup_s == 31.0 and merged.metrics.cpu_neighbours == 0.01  # medians
    assert [r["cpu_neighbours"] for r in merged.metrics.repeats] == [0.0, 0.5, 0.01]
    assert 1.15 < paired_ratio(merged.metrics).ratio < 1.3
    assert NEIGHBOUR_LIMIT > merged.metrics.cpu_neighbours  # the one loaded run is outvoted


def _paired(ratio, seed):
    base, recipe = _blocks(ratio, 30, noise=0.005, seed=seed)
    return {"baseline": "eager", "base_s": base, "recipe_s": recipe, "same_batches": True}


def test_intervals_cover_what_another_process_of_the_same_code_gave():
    """The issue's quiet run: full 1.10–1.18 and full-warm 1.08–1.09, disjoint, for the same code.

    Each row's interval is now widened by the spread measured between the two processes, so each
    holds the other's ratio, and the method says what it covers."""
    rows = [
        _row("eager", 4.0),
        _row("full", 4.5, _paired(1.14, 1)),
        _row("full-warm", 4.4, _paired(1.085, 2)),
    ]
    compare(rows, RECIPES)
    full, warm = rows[1].metrics.speedup, rows[2].metrics.speedup
    assert full.ratio == pytest.approx(1.14, rel=0.01) and warm.ratio == pytest.approx(
        1.085, rel=0.01
    )
    for one, other in ((full, warm), (warm, full)):
        assert one.low <= other.ratio <= one.high, (one, other)
        assert "widened by ±5.1%" in one.method and "full and full-warm" in one.method
    # the blocks alone were narrow and disjoint (what the table used to print)
    own = [
        ratio_interval(m["base_s"], m["recipe_s"]) for m in (_paired(1.14, 1), _paired(1.085, 2))
    ]
    assert own[1].high < own[0].low, own


def test_without_a_second_process_the_interval_says_it_is_of_one_process():
    rows = [_row("eager", 4.0), _row("full", 4.5, _paired(1.14, 1))]
    compare(rows, RECIPES)
    assert "this process only" in rows[1].metrics.speedup.method


def test_rounds_of_one_row_measure_the_spread_too():
    rounds = [
        RecipeResult(
            name="regional",
            status="ok",
            metrics=Metrics(steps_per_s=4.0, step_times_s=[0.25] * 30, paired=_paired(ratio, seed)),
        )
        for ratio, seed in ((1.3, 1), (1.2, 2))
    ]
    rows = [_row("eager", 4.0), merge_repeats(rounds)]
    compare(rows, RECIPES)
    regional = rows[1].metrics.speedup
    assert "the 2 rounds of regional" in regional.method
    assert regional.low <= 1.2 and regional.high >= 1.3, regional
