"""Metrics: tokens and padding from the mask, and the comparisons across recipes."""

from __future__ import annotations

import pytest
import torch

from torchcompile_kit.bench.metrics import compare, measure_training, real_and_computed
from torchcompile_kit.bench.outcome import CacheUse, Metrics, RecipeResult, Speedup
from torchcompile_kit.bench.recipes import RECIPES
from torchcompile_kit.bench.results import BenchResults


def test_real_and_computed_tokens():
    mask = torch.tensor([[1, 1, 0, 0], [1, 1, 1, 0]])
    assert real_and_computed(
        {"decoder_attention_mask": mask, "attention_mask": torch.ones(2, 9)}
    ) == (5, 8)
    assert real_and_computed({"input_ids": torch.ones(2, 3)}) == (6, 6)
    assert real_and_computed({"pixel_values": torch.ones(2, 3)}) == (0, 0)


def test_measure_training_counts_steps_and_padding():
    batches = iter([{"attention_mask": torch.tensor([[1, 0]])}] * 5)
    seen = []
    metrics = measure_training(
        lambda batch: torch.tensor(2.0),
        batches,
        warmup_steps=2,
        steps=3,
        device=torch.device("cpu"),
        on_step=lambda i, n, phase: seen.append((i, phase)),
    )
    assert seen == [(1, "warm-up"), (2, "warm-up"), (3, "steady"), (4, "steady"), (5, "steady")]
    assert metrics.losses == [2.0] * 5 and len(metrics.step_times_s) == 3
    assert metrics.padding == 0.5 and metrics.warmup_s >= metrics.first_step_s > 0
    assert metrics.steps_per_s > 0 and metrics.peak_memory_mb > 0


def test_the_first_step_says_how_long_the_garbage_collector_ran_in_it():
    """A full collection of a large heap (0.3 s, measured on a warm start) lands in whichever step
    allocates past the collector's threshold: the first step's share is measured, not guessed."""
    import gc
    import time

    def step(batch):
        if batch["collect"]:  # a collection that takes a while: a heap of cyclic garbage
            for _ in range(200_000):
                node = {}
                node["self"] = node
            started = time.perf_counter()
            gc.collect()
            step.collected = time.perf_counter() - started
        return torch.tensor(1.0)

    batches = iter([{"collect": True}] + [{"collect": False}] * 3)
    metrics = measure_training(step, batches, warmup_steps=2, steps=2, device=torch.device("cpu"))
    assert metrics.first_step_gc_s >= step.collected > 0
    assert metrics.first_step_gc_s <= metrics.first_step_s


def test_a_warm_start_line_names_the_collectors_share_of_the_first_step():
    from torchcompile_kit.bench.report import warm_start_lines

    cold = RecipeResult(name="regional", status="ok", metrics=Metrics(first_step_s=17.0))
    warm = RecipeResult(
        name="regional-warm",
        status="ok",
        metrics=Metrics(cache=CacheUse(load_s=0.05), first_step_s=0.55, first_step_gc_s=0.31),
    )
    (line,) = warm_start_lines([warm], [cold, warm])
    assert "of its first step, 0.31 s was Python's garbage collector" in line
    warm.metrics.first_step_gc_s = 0.03  # young-generation collections: not worth a word
    (line,) = warm_start_lines([warm], [cold, warm])
    assert "garbage collector" not in line


def _row(name, steps_per_s, warmup_s, losses):
    return RecipeResult(
        name=name,
        status="ok",
        metrics=Metrics(steps_per_s=steps_per_s, warmup_s=warmup_s, losses=losses),
    )


def test_compare_uses_each_groups_baseline_and_the_loss_reference():
    rows = [
        _row("eager", 2.0, 1.0, [1.0, 2.0]),
        _row("full", 4.0, 10.0, [1.0, 2.5]),
        _row("eager-longest", 8.0, 1.0, [1.0, 2.0]),
        _row("mark-dynamic", 12.0, 12.0, [1.0, 2.0]),
        _row("buckets", 16.0, 20.0, [9.0, 9.0]),
        RecipeResult(name="regional", status="failed"),
    ]
    compare(rows, RECIPES)
    m = {row.name: row.metrics for row in rows}
    assert m["full"].speedup.ratio == 2.0 and m["mark-dynamic"].speedup.ratio == 1.5  # ÷ e.-longest
    assert m["full"].speedup.paired is False and m["full"].speedup.baseline == "eager"
    assert m["mark-dynamic"].speedup.baseline == "eager-longest"
    assert m["full"].warmup_ratio == 1.0 and m["buckets"].warmup_ratio == 2.0
    assert m["full"].loss_max_abs_diff == 0.5 and m["eager"].loss_max_abs_diff == 0.0
    assert m["buckets"].loss_max_abs_diff is None  # other batches: no comparison
    assert m["regional"] == Metrics()


def test_results_round_trip_through_json(tmp_path):
    from torchcompile_kit.bench.results import load_results, write_results

    rows = [_row("eager", 2.0, 1.0, [1.0, 2.0]), _row("full", 4.0, 10.0, [1.0, 2.5])]
    rows[1].metrics.paired = {"baseline": "eager", "base_s": [[0.2, 0.2]], "recipe_s": [[0.1, 0.1]]}
    document = BenchResults(rows=rows, settings={"preset": "tiny"}, environment={"torch": "x"})
    assert load_results(write_results(tmp_path, document)) == document


def test_planned_tokens_follow_the_whole_run_not_its_start():
    import torch

    from torchcompile_kit.bench import PRESETS, RECIPES, ModelSpec
    from torchcompile_kit.bench.batches import planned_tokens_per_step

    def make_batch(step):  # the first 100 steps are short batches, the rest long
        width = 8 if step < 100 else 40
        return {"input_ids": torch.zeros(4, width, dtype=torch.long)}

    spec = ModelSpec(source="t", model=torch.nn.Linear(1, 1), make_batch=make_batch)
    tokens = planned_tokens_per_step(RECIPES["eager"], spec, PRESETS["tiny"], "cpu", 1000)
    assert tokens == pytest.approx(0.1 * 4 * 8 + 0.9 * 4 * 40, rel=0.01)
    # a run of 100 steps sees only the short ones
    assert planned_tokens_per_step(RECIPES["eager"], spec, PRESETS["tiny"], "cpu", 100) == 32


def test_measure_training_records_each_timed_steps_tokens():
    import torch

    widths = iter([8, 16, 24, 32])
    batches = ({"input_ids": torch.zeros(2, next(widths))} for _ in range(4))
    out = measure_training(lambda b: 0.0, batches, warmup_steps=1, steps=3, device="cpu")
    assert out.step_tokens == [32, 48, 64] and len(out.step_times_s) == 3


def test_cpu_steal_is_read_from_proc_stat_where_there_is_one():
    from torchcompile_kit.bench.metrics import cpu_times, steal_share

    before = cpu_times()
    sum(range(200_000))
    after = cpu_times()
    if before is None:
        pytest.skip("no /proc/stat on this system")
    share = steal_share(before, after)
    assert share is None or 0.0 <= share <= 1.0
    assert steal_share(before, None) is None
    assert after[1] >= before[1] and after[0] >= before[0]


def test_steady_steps_go_on_until_they_cover_the_window_and_stop_at_the_cap():
    import time

    def sleepy(batch):
        time.sleep(0.01)
        return 0.0

    batches = iter(lambda: {"input_ids": torch.zeros(1, 4)}, None)
    # the window is sized from this machine's own step time, so a slow or busy machine still
    # needs more than the 2 steps asked for to cover it
    probe = measure_training(sleepy, batches, warmup_steps=1, steps=3, device="cpu")
    window = 8 * max(probe.step_times_s)
    totals = []
    out = measure_training(
        sleepy,
        batches,
        warmup_steps=1,
        steps=2,
        device="cpu",
        min_steady_s=window,
        on_step=lambda i, n, phase: totals.append(n),
    )
    # more steps than the 2 asked for were timed to cover the window; the progress total grew
    assert out.steps == len(out.step_times_s) > 2
    assert out.steady_s == pytest.approx(sum(out.step_times_s)) and out.steady_s >= window
    assert totals[0] == 3 and totals[-1] == 1 + out.steps
    capped = measure_training(
        sleepy, batches, warmup_steps=1, steps=2, device="cpu", min_steady_s=10.0, max_steps=5
    )
    assert capped.steps == 5  # never more steady steps than the cap (the planned run)
    plain = measure_training(sleepy, batches, warmup_steps=1, steps=2, device="cpu")
    assert plain.steps == 2


def test_a_warm_start_ratio_from_an_unquotable_row_says_so():
    """bench printed 'warm ÷ cold 0.012' from a cold row measured with 89% of the CPU taken."""
    from torchcompile_kit.bench.report import warm_start_lines

    cold = RecipeResult(
        name="full",
        status="ok",
        metrics=Metrics(first_step_s=50.0, not_quotable=["other processes used 89% of the CPU"]),
    )
    warm = RecipeResult(
        name="full-warm", status="ok", metrics=Metrics(first_step_s=0.5, cache=CacheUse(load_s=0.1))
    )
    (line,) = warm_start_lines([warm], [cold, warm])
    assert "warm ÷ cold 0.012" in line and "NOT QUOTABLE" in line and "89% of the CPU" in line
    cold.metrics.not_quotable = []
    (line,) = warm_start_lines([warm], [cold, warm])
    assert "NOT QUOTABLE" not in line and "whole restart" not in line  # builds not measured


def test_the_restart_path_is_named_from_the_counts():
    from torchcompile_kit.bench.report import restart_path

    stats = {
        "fxgraph_cache_hit": 4,
        "fxgraph_cache_miss": 0,
        "autograd_cache_hit": 2,
        "autograd_cache_miss": 0,
    }
    retraced = Metrics(cache=CacheUse(loaded=True, stats=stats), monitor={"frames": 2})
    assert restart_path(retraced).startswith(
        "re-traced, graphs from the cache (dynamo traced 2 frames;"
    )
    missed = Metrics(
        cache=CacheUse(loaded=True, stats={**stats, "fxgraph_cache_miss": 1}), monitor={"frames": 1}
    )
    assert "1 graph(s) compiled again" in restart_path(missed)
    assert restart_path(
        Metrics(cache=CacheUse(loaded=True, stats=stats), monitor={"frames": 0})
    ).startswith("not re-traced, graphs from the cache (no frame traced;")
    assert restart_path(Metrics(cache=CacheUse(loaded=False), monitor={"frames": 2})) is None


def test_the_whole_restart_counts_import_load_build_and_first_step():
    from torchcompile_kit.bench.report import warm_start_lines

    cold = RecipeResult(
        name="regional",
        status="ok",
        metrics=Metrics(import_compiler_s=2.0, build_s=1.0, first_step_s=17.0),
    )
    warm = RecipeResult(
        name="regional-warm",
        status="ok",
        metrics=Metrics(
            import_compiler_s=2.0, cache=CacheUse(load_s=0.5), build_s=1.5, first_step_s=1.0
        ),
    )
    (line,) = warm_start_lines([warm], [cold, warm])
    assert "warm ÷ cold 0.088" in line  # (0.5 + 1.0) / 17
    assert "whole restart 5.00 s ÷ 20.00 s = 0.250" in line


def test_the_charts_name_the_group_of_each_colour(tmp_path):
    """The bars were coloured by group with no legend saying which colour is which."""
    from torchcompile_kit.bench import charts

    rows = [
        RecipeResult(
            name=n,
            group=g,
            status="ok",
            metrics=Metrics(warmup_s=2.0, steps_per_s=3.0, speedup=Speedup(ratio=1.1)),
        )
        for n, g in (("eager", "static"), ("full", "static"), ("regional", "warm-up"))
    ]
    figure = charts._figure(len(rows))
    axes = figure.add_subplot(1, 1, 1)
    charts._group_legend(axes, rows)
    assert [t.get_text() for t in axes.get_legend().get_texts()] == ["static", "warm-up"]
    written = charts.write_charts(BenchResults(rows=rows), tmp_path)
    assert {p.name for p in written} == {"warmup.png", "throughput.png", "speedup.png"}


def _chart_rows():
    loaded = ["other processes used 31% of the machine's CPU during it (limit 10%)"]

    def row(name, group, steps_per_s, not_quotable):
        return RecipeResult(
            name=name,
            group=group,
            status="ok",
            metrics=Metrics(
                warmup_s=2.0,
                steps_per_s=steps_per_s,
                speedup=Speedup(ratio=1.1),
                not_quotable=not_quotable,
            ),
        )

    return [
        row("eager", "static", 1.0, []),
        row("full", "static", 1.2, loaded),
        row("eager-longest", "dynamic", 64.9, []),
        row("buckets", "dynamic", 70.0, loaded),
    ]


def test_every_chart_marks_the_rows_not_to_quote():
    """throughput.png and warmup.png carried no marking; only speedup.png hatched such rows."""
    from torchcompile_kit.bench import charts

    rows = _chart_rows()
    figures = [
        charts.bar_figure(rows, "warmup_s", "warm-up", "seconds"),
        charts.throughput_figure(rows, "throughput"),
        charts.ratio_figure(rows, "ratio"),
    ]
    for figure in figures:
        hatched, labels = set(), []
        for axes in figure.axes:
            names = [t.get_text() for t in axes.get_yticklabels()]
            bars = [p for p in axes.patches if p.get_height() > 0 and p.get_width() > 0]
            hatched |= {name for name, bar in zip(names, bars) if bar.get_hatch()}
            labels += [t.get_text() for t in axes.texts if "not quotable" in t.get_text()]
        assert hatched == {"full", "buckets"}, (figure.axes[0].get_title(), hatched)
        assert len(labels) == 2, labels
        assert "hatched: not to be quoted" in figure.axes[-1].get_xlabel()


def test_throughput_draws_each_baseline_on_its_own_axis():
    """Steps/s of pad-to-max and pad-to-longest rows shared one axis (eager 1.00, eager-longest
    64.9)."""
    from torchcompile_kit.bench import charts

    figure = charts.throughput_figure(_chart_rows(), "throughput")
    panels = [
        sorted(t.get_text() for t in axes.get_yticklabels())
        for axes in figure.axes
        if axes.get_yticklabels()
    ]
    assert sorted(panels) == [["buckets", "eager-longest"], ["eager", "full"]], panels
