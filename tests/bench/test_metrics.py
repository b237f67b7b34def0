"""Metrics: tokens and padding from the mask, and the comparisons across recipes."""

from __future__ import annotations

import torch

from torchcompile_kit.bench.metrics import compare, measure_training, real_and_computed
from torchcompile_kit.bench.recipes import RECIPES


def test_real_and_computed_tokens():
    mask = torch.tensor([[1, 1, 0, 0], [1, 1, 1, 0]])
    assert real_and_computed({"decoder_attention_mask": mask, "attention_mask": torch.ones(2, 9)}) == (5, 8)
    assert real_and_computed({"input_ids": torch.ones(2, 3)}) == (6, 6)
    assert real_and_computed({"pixel_values": torch.ones(2, 3)}) == (0, 0)


def test_measure_training_counts_steps_and_padding():
    batches = iter([{"attention_mask": torch.tensor([[1, 0]])}] * 5)
    seen = []
    metrics = measure_training(
        lambda batch: torch.tensor(2.0), batches, warmup_steps=2, steps=3, device=torch.device("cpu"),
        on_step=lambda i, n, phase: seen.append((i, phase)),
    )
    assert seen == [(1, "warm-up"), (2, "warm-up"), (3, "steady"), (4, "steady"), (5, "steady")]
    assert metrics["losses"] == [2.0] * 5 and len(metrics["step_times_s"]) == 3
    assert metrics["padding"] == 0.5 and metrics["warmup_s"] >= metrics["first_step_s"] > 0
    assert metrics["steps_per_s"] > 0 and metrics["peak_memory_mb"] > 0


def _row(name, steps_per_s, warmup_s, losses):
    return {"name": name, "status": "ok", "metrics": {"steps_per_s": steps_per_s, "warmup_s": warmup_s, "losses": losses}}


def test_compare_uses_each_groups_baseline_and_the_loss_reference():
    rows = [
        _row("eager", 2.0, 1.0, [1.0, 2.0]),
        _row("full", 4.0, 10.0, [1.0, 2.5]),
        _row("eager-longest", 8.0, 1.0, [1.0, 2.0]),
        _row("mark-dynamic", 12.0, 12.0, [1.0, 2.0]),
        _row("buckets", 16.0, 20.0, [9.0, 9.0]),
        {"name": "nested", "status": "failed", "metrics": {}},
    ]
    compare(rows, RECIPES)
    m = {row["name"]: row["metrics"] for row in rows}
    assert m["full"]["speedup"] == 2.0 and m["mark-dynamic"]["speedup"] == 1.5  # ÷ eager-longest
    assert m["full"]["warmup_ratio"] == 1.0 and m["buckets"]["warmup_ratio"] == 2.0
    assert m["full"]["loss_max_abs_diff"] == 0.5 and m["eager"]["loss_max_abs_diff"] == 0.0
    assert "loss_max_abs_diff" not in m["buckets"]  # other batches: no comparison
    assert m["nested"] == {}
