"""PNG charts of a bench run (warm-up seconds, steps/s, the paired ratio with its interval), with
matplotlib's ``Agg`` backend on private figures; without matplotlib no chart is written.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from .._compat import is_package_available
from .outcome import RecipeResult
from .recipes import RECIPES
from .results import BenchResults

__all__ = [
    "bar_figure",
    "charts_available",
    "ratio_figure",
    "throughput_figure",
    "timeline_figure",
    "write_charts",
    "write_comparison_chart",
]

_GROUP_COLORS = {
    "static": "#4C72B0",
    "dynamic": "#55A868",
    "warm-up": "#C44E52",
    "distributed": "#8172B2",
}
_OTHER_COLOR = "#937860"  # a row of no known group (a custom recipe)


def _color(group: str | None) -> str:
    return _GROUP_COLORS.get(group, _OTHER_COLOR)


def _group_legend(axes: Any, rows: Sequence[RecipeResult]) -> None:
    """A legend naming the group of each bar colour shown (the table's groups)."""
    from matplotlib.patches import Patch

    groups = list(dict.fromkeys(row.group or "other" for row in rows))
    handles = [Patch(color=_color(g), label=g) for g in groups]
    axes.legend(handles=handles, title="group", fontsize=7, title_fontsize=7, loc="best")


def charts_available() -> bool:
    """Whether matplotlib is installed (charts are written only then)."""
    return is_package_available("matplotlib")


def _figure(height_rows: int) -> Any:
    from matplotlib.figure import Figure  # a private figure: no pyplot, no global backend switch

    return Figure(figsize=(8, 1.2 + 0.35 * max(height_rows, 1)), dpi=110)


_NOT_QUOTABLE = "//"  # the hatch of a row whose timings are not to be quoted, in every chart


def _bars(axes: Any, rows: Sequence[RecipeResult], key: str) -> None:
    """One horizontal bar per row (first row on top): hatched and labelled when not quotable."""
    rows = list(rows)[::-1]
    values = [getattr(r.metrics, key) for r in rows]
    bars = axes.barh(
        [r.name for r in rows],
        values,
        color=[_color(r.group) for r in rows],
        hatch=[_NOT_QUOTABLE if r.metrics.not_quotable else "" for r in rows],
    )
    axes.bar_label(
        bars,
        labels=[
            f"{v:.3g}" + (" not quotable" if r.metrics.not_quotable else "")
            for v, r in zip(values, rows)
        ],
        padding=3,
        fontsize=8,
    )
    axes.margins(x=0.3)


def bar_figure(rows: Sequence[RecipeResult], key: str, title: str, xlabel: str) -> Any:
    """One bar per ok row of ``key`` (warm-up seconds), or ``None`` without such a row."""
    ok = [r for r in rows if r.status == "ok" and getattr(r.metrics, key)]
    if not ok:
        return None
    figure = _figure(len(ok))
    axes = figure.add_subplot(1, 1, 1)
    _bars(axes, ok, key)
    _group_legend(axes, ok)
    axes.set_title(title, fontsize=10)
    axes.set_xlabel(f"{xlabel}; hatched: not to be quoted")
    return figure


def throughput_figure(rows: Sequence[RecipeResult], title: str) -> Any:
    """Steps/s, one panel per baseline: rows padded differently (pad to max, pad to longest) step
    different batches, so their steps/s share no axis; within a panel, a baseline and the rows
    compared with it. ``None`` without an ok row."""
    ok = [r for r in rows if r.status == "ok" and r.metrics.steps_per_s]
    if not ok:
        return None
    panels: dict[str, list[RecipeResult]] = {}
    for row in ok:
        panels.setdefault(_baseline_of(row, ok), []).append(row)
    figure = _figure(len(ok) + 2 * len(panels))
    for index, (baseline, members) in enumerate(panels.items()):
        axes = figure.add_subplot(len(panels), 1, index + 1)
        _bars(axes, members, "steps_per_s")
        _group_legend(axes, members)
        axes.set_title(
            f"rows compared with {baseline}" + (f": {title}" if index == 0 else ""), fontsize=9
        )
    figure.axes[-1].set_xlabel(
        "steps/s (higher is better; each panel its own batches and axis; hatched: not to be quoted)"
    )
    return figure


def _baseline_of(row: RecipeResult, rows: Sequence[RecipeResult]) -> str:
    """The baseline a row is compared with (a baseline: itself)."""
    recipe = RECIPES.get(row.name)
    measured = row.metrics.speedup.baseline if row.metrics.speedup is not None else None
    baseline = measured or (recipe.baseline if recipe is not None else "eager")
    if (
        any(
            RECIPES.get(other.name) is not None and RECIPES[other.name].baseline == row.name
            for other in rows
        )
        or row.name == "eager"
    ):
        return row.name
    return baseline


def _save(figure: Any, path: Path) -> Path | None:
    if figure is None:
        return None
    figure.tight_layout()
    figure.savefig(path)
    return path


def ratio_figure(rows: Sequence[RecipeResult], title: str) -> Any:
    """× base per recipe with its interval as error bars; rows not to be quoted are hatched."""
    ok = [r for r in rows if r.status == "ok" and r.metrics.speedup]
    if not ok:
        return None
    ok = ok[::-1]
    metrics = [r.metrics for r in ok]
    speedups = [m.speedup for m in metrics]
    values = [s.ratio for s in speedups]
    low = [s.ratio - (s.low or s.ratio) for s in speedups]
    high = [(s.high or s.ratio) - s.ratio for s in speedups]
    figure = _figure(len(ok))
    axes = figure.add_subplot(1, 1, 1)
    bars = axes.barh(
        [r.name for r in ok],
        values,
        xerr=[low, high],
        capsize=3,
        color=[_color(r.group) for r in ok],
        hatch=[_NOT_QUOTABLE if m.not_quotable else "" for m in metrics],
    )
    labels = [
        f"{m.speedup.ratio:.2f}"
        + (f" ({m.speedup.interval()})" if m.speedup.interval() else "")
        + (" not quotable" if m.not_quotable else "")
        for m in metrics
    ]
    axes.bar_label(bars, labels=labels, padding=6, fontsize=7)
    _group_legend(axes, ok[::-1])
    axes.axvline(1.0, color="grey", lw=0.8, ls="--")
    axes.set_title(title, fontsize=10)
    axes.set_xlabel(
        "× the group's baseline, 95% interval (higher is better; hatched: not to be quoted)"
    )
    axes.margins(x=0.35)
    return figure


def timeline_figure(rows: Sequence[RecipeResult], title: str) -> Any:
    """Steps done against wall time, one line per row, when a row compiled in the background."""
    ok = [r for r in rows if r.status == "ok" and r.metrics.step_ends_s]
    if not any(r.metrics.background for r in ok):
        return None
    figure = _figure(8)
    axes = figure.add_subplot(1, 1, 1)
    for row in ok:
        ends = row.metrics.step_ends_s
        axes.plot([0.0, *ends], range(len(ends) + 1), label=row.name, lw=1.2)
        switched = row.metrics.background.switched_at_call if row.metrics.background else None
        if switched and switched <= len(ends):
            axes.plot(ends[switched - 1], switched, "o", color="black", ms=4)
    axes.set_title(title, fontsize=10)
    axes.set_xlabel("seconds from the first step (the dot: the switch to compiled code)")
    axes.set_ylabel("steps done")
    axes.legend(fontsize=8, loc="best")
    return figure


def write_charts(document: BenchResults, out_dir: str | os.PathLike[str]) -> list[Path]:
    """Write ``warmup.png``, ``throughput.png`` and ``speedup.png`` for a run into ``out_dir``, and
    ``timeline.png`` (steps against wall time) when a row compiled in the background; returns the
    files (none without matplotlib or ok rows)."""
    if not charts_available():
        return []
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    settings, env, rows = document.settings, document.environment, document.rows
    where = f"{settings.get('model')}, {env.get('device')}, torch {env.get('torch')}"
    warmup = f"warm-up: first {settings.get('warmup_steps')} steps from a cold start ({where})"
    written = [
        _save(
            bar_figure(rows, "warmup_s", warmup, "seconds (lower is better)"), out / "warmup.png"
        ),
        _save(
            throughput_figure(rows, f"median of {settings.get('steps')} steps ({where})"),
            out / "throughput.png",
        ),
        _save(ratio_figure(rows, f"paired ratio to the baseline ({where})"), out / "speedup.png"),
        _save(
            timeline_figure(rows, f"steps done against wall time ({where})"), out / "timeline.png"
        ),
    ]
    return [path for path in written if path is not None]


def write_comparison_chart(
    first: BenchResults,
    second: BenchResults,
    path: str | os.PathLike[str],
    *,
    labels: Sequence[str] = ("A", "B"),
) -> Path | None:
    """Two runs side by side as grouped bars (warm-up seconds, steps/s) in a PNG at ``path``;
    ``None`` without matplotlib or a recipe both ran."""
    if not charts_available():
        return None
    a_rows = {r.name: r.metrics for r in first.rows if r.status == "ok"}
    b_rows = {r.name: r.metrics for r in second.rows if r.status == "ok"}
    names = [n for n in a_rows if n in b_rows]
    if not names:
        return None
    figure = _figure(2 * len(names))
    for column, (key, title) in enumerate((("warmup_s", "warm-up s"), ("steps_per_s", "steps/s"))):
        axes = figure.add_subplot(1, 2, column + 1)
        positions = range(len(names))
        for offset, (label, rows) in zip((-0.2, 0.2), zip(labels, (a_rows, b_rows))):
            values = [getattr(rows[n], key) or 0 for n in names]
            axes.barh([p + offset for p in positions], values, height=0.4, label=label)
        axes.set_yticks(list(positions), names if column == 0 else [""] * len(names))
        axes.invert_yaxis()
        axes.set_title(title, fontsize=10)
    figure.axes[0].legend(fontsize=8)
    figure.tight_layout()
    figure.savefig(path)
    return Path(path)
