"""The tables of a bench run: one per group (static, dynamic, warm-up, distributed), and two runs
side by side (before/after, CPU/GPU). Text for the terminal, Markdown for docs.

``torchcompile-kit report DIR [DIR2]`` re-renders them from saved ``results.json`` files.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict
from typing import Any

from .outcome import Metrics, RecipeResult
from .results import BenchResults

__all__ = [
    "background_lines",
    "format_comparison",
    "format_results",
    "render_table",
    "restart_path",
    "warm_start_lines",
]

# (column label, metric key, format)
_COLUMNS: list[tuple[str, str, str]] = [
    ("warm-up s", "warmup_s", "{:.1f}"),
    ("steps/s", "steps_per_s", "{:.2f}"),
    ("× base", "speedup", "{:.2f}"),
    ("95% interval", "speedup_interval", "{}"),
    ("tokens/s", "tokens_per_s", "{:.0f}"),
    ("graphs", "graphs", "{}"),
    ("recompiles", "recompiles", "{}"),
    ("breaks", "graph_breaks", "{}"),
    ("padding", "padding", "{:.0%}"),
    ("peak MB", "peak_memory_mb", "{:.0f}"),
    ("reserved MB", "peak_reserved_mb", "{:.0f}"),
    ("|Δloss|", "loss_max_abs_diff", "{:.1e}"),
    ("others CPU", "cpu_neighbours", "{:.0%}"),
    ("quote", "quote", "{}"),
]
_GROUP_TITLES = {
    "static": "static shapes (pad to max); × base = ratio to eager",
    "dynamic": "dynamic shapes (variable caption length); × base = ratio to eager-longest",
    "warm-up": "warm-up (cold vs warm compile); × base = ratio to eager",
    "distributed": "distributed",
}
_HOW_TO_READ = (
    "× base: the median of the per-block ratios of the row's steps to its baseline's, "
    "stepped in alternating blocks in the row's own process (load that comes and goes "
    "hits both); 95% interval: bootstrap over the blocks, widened by how far the "
    "same compiled code's ratio moved between processes in this run (the line "
    "below). others CPU: the share of "
    "the machine's CPU other processes used during the row. quote NO: see the note "
    "under the table. A row whose interval reads 'unpaired' (--no-pair, DDP) divides "
    "its steps/s by the baseline row's."
)
_ADVICE = (
    "re-run on a quiet machine, or with --repeat 3 (each row 3 times in rounds, blocks pooled)"
)


def _cell(value: Any, fmt: str) -> str:
    if value is None:
        return "–"
    try:
        return fmt.format(value)
    except (ValueError, TypeError):
        return str(value)


def render_table(
    header: Sequence[str], body: Sequence[Sequence[str]], *, markdown: bool = False
) -> str:
    """An aligned text (or GitHub Markdown) table of string cells.

    Example:
        >>> print(render_table(["a", "b"], [["1", "22"]]))  # doctest: +NORMALIZE_WHITESPACE
        a  b
        -  --
        1  22
    """
    if markdown:
        lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
        lines += ["| " + " | ".join(row) + " |" for row in body]
        return "\n".join(lines)
    widths = [
        max(len(h), *(len(r[i]) for r in body)) if body else len(h) for i, h in enumerate(header)
    ]
    lines = ["  ".join(h.ljust(w) for h, w in zip(header, widths)).rstrip()]
    lines.append("  ".join("-" * w for w in widths))
    lines += ["  ".join(c.ljust(w) for c, w in zip(row, widths)).rstrip() for row in body]
    return "\n".join(lines)


def _cells(metrics: Metrics) -> dict[str, Any]:
    """The table's cells: the metrics, the interval as text, and whether the row may be quoted."""
    speedup = metrics.speedup
    cells = asdict(metrics)
    cells["speedup"] = speedup.ratio if speedup is not None else None
    cells["speedup_interval"] = speedup.interval() if speedup is not None else None
    if metrics.not_quotable is not None:
        cells["quote"] = "NO" if metrics.not_quotable else "yes"
    if speedup is not None and not speedup.paired:  # the rows were measured minutes apart
        cells["speedup_interval"] = "unpaired"
    return cells


def _status_note(row: RecipeResult) -> str:
    if row.status == "skipped":
        return f"skipped: {row.reason or ''}"
    if row.status == "failed":
        first = (row.error or "").strip().splitlines()
        return f"FAILED: {first[0] if first else ''}"[:160]
    return ""


def format_results(document: BenchResults, *, markdown: bool = False) -> str:
    """A run's tables, one per group, with the setup line and failures/skips under each."""
    env, settings = document.environment, document.settings
    out = [
        (
            f"torchcompile-kit bench — {settings.get('model', '?')}, preset "
            f"{settings.get('preset')}, "
            f"{settings.get('warmup_steps')} warm-up + {settings.get('steps')} steps, backend "
            f"{settings.get('backend')}; {env.get('device')}, torch {env.get('torch')}, "
            f"{env.get('date', '')[:10]}, commit {env.get('git_commit')}"
            + (
                f"; each row {settings['repeat']} times, pooled"
                if (settings.get("repeat") or 1) > 1
                else ""
            )
        ),
        _HOW_TO_READ
        if settings.get("paired", True)
        else "× base: steps/s ÷ the baseline row's (--no-pair: "
        "rows measured minutes apart, not robust to load from other processes)",
    ]
    methods = [
        row.metrics.speedup.method
        for row in document.rows
        if row.status == "ok" and row.metrics.speedup and row.metrics.speedup.low is not None
    ]
    for marker in ("widened by", "this process only"):  # what the intervals cover
        if methods and settings.get("paired", True) and marker in methods[0]:
            out.append("intervals: " + methods[0][methods[0].index(marker) :])
    if not document.complete:
        done = {row.name for row in document.rows}
        missing = [name for name in settings.get("recipes", []) if name not in done]
        out.append(
            f"PARTIAL RUN (interrupted, or still running): {len(done)} of "
            f"{len(done) + len(missing)} recipes; not run: {', '.join(missing) or '-'}"
        )
    groups: dict[str, list[RecipeResult]] = {}
    for row in document.rows:
        groups.setdefault(row.group or "custom", []).append(row)
    header = ["recipe", *(label for label, _, _ in _COLUMNS)]
    for group, rows in groups.items():
        body, notes = [], []
        for row in rows:
            metrics = row.metrics
            if row.status == "ok":
                cells = _cells(metrics)
                body.append([row.name, *(_cell(cells.get(key), fmt) for _, key, fmt in _COLUMNS)])
                notes += [f"{row.name}: {note}" for note in metrics.notes]
                if metrics.not_quotable:
                    notes.append(
                        f"{row.name}: not to be quoted: {'; '.join(metrics.not_quotable)}; "
                        f"{_ADVICE}"
                    )
            else:
                body.append([row.name, *(["–"] * len(_COLUMNS))])
                notes.append(f"{row.name}: {_status_note(row)}")
        out += [
            "",
            f"== {group}: {_GROUP_TITLES.get(group, '')}".rstrip(": "),
            render_table(header, body, markdown=markdown),
        ]
        out += [f"  {note}" for note in notes]
        if group == "warm-up":
            out += [f"  {line}" for line in warm_start_lines(rows, document.rows)]
            out += [f"  {line}" for line in background_lines(rows, document.rows)]
    return "\n".join(out)


def restart_path(metrics: Metrics) -> str | None:
    """Which path a warm row's restart took (``None``: not a warm row), from the frames dynamo
    traced and torch's FX-graph and AOTAutograd cache counters after the load.

    Example:
        >>> stats = {"fxgraph_cache_hit": 2, "fxgraph_cache_miss": 0,
        ...          "autograd_cache_hit": 1, "autograd_cache_miss": 0}
        >>> metrics = Metrics(cache=CacheUse(loaded=True, stats=stats), monitor={"frames": 1})
        >>> restart_path(metrics)  # doctest: +NORMALIZE_WHITESPACE
        're-traced, graphs from the cache (dynamo traced 1 frame; FX-graph cache 2 hits / 0 misses,
        AOTAutograd 1 / 0)'
    """
    if not metrics.cache.loaded or metrics.monitor is None:
        return None
    frames = int(metrics.monitor.get("frames") or 0)
    stats = metrics.cache.stats or {}
    hits = stats.get("fxgraph_cache_hit", 0) + stats.get("autograd_cache_hit", 0)
    misses = stats.get("fxgraph_cache_miss", 0) + stats.get("autograd_cache_miss", 0)
    traced = f"dynamo traced {frames} frame{'s' * (frames != 1)}" if frames else "no frame traced"
    graphs = (
        "graphs from the cache"
        if hits and not misses
        else f"{misses} graph(s) compiled again"
        if misses
        else "no graph compiled"
        if not frames
        else "no cached graph used"
    )
    rest = (
        f"{'re-traced' if frames else 'not re-traced'}, {graphs} ({traced}; FX-graph cache "
        f"{stats.get('fxgraph_cache_hit', 0)} hits / {stats.get('fxgraph_cache_miss', 0)} "
        f"misses, AOTAutograd {stats.get('autograd_cache_hit', 0)} / "
        f"{stats.get('autograd_cache_miss', 0)})"
    )
    if not metrics.regions:
        return rest
    return (
        "; ".join(f"{name} {path}" for name, path in metrics.regions.items()) + f"; the rest {rest}"
    )


def warm_start_lines(
    warm_rows: Sequence[RecipeResult], all_rows: Sequence[RecipeResult]
) -> list[str]:
    """For each warm row whose cold row ran too: (cache load + first step) ÷ the cold first step,
    and the whole restart (compiler import + load + build + first step) ÷ the cold row's, noting
    rows that are not quotable.

    Example:
        >>> cold = RecipeResult(name="full", status="ok", metrics=Metrics(first_step_s=50.0,
        ...     build_s=1.8))
        >>> warm = RecipeResult(name="full-warm", status="ok",
        ...     metrics=Metrics(first_step_s=4.4, cache=CacheUse(load_s=0.1), build_s=1.8))
        >>> warm_start_lines([warm], [cold, warm])[0]  # doctest: +NORMALIZE_WHITESPACE
        'full-warm: cache load 0.10 s + first step 4.40 s = 4.50 s; cold first step (full) 50.00 s;
        warm ÷ cold 0.090 (model build 1.80 s warm, 1.80 s cold; whole restart 6.30 s ÷ 51.80 s =
        0.122)'
    """
    from .recipes import RECIPES

    by_name = {row.name: row for row in all_rows if row.status == "ok"}
    lines = []
    for row in warm_rows:
        recipe = RECIPES.get(row.name)
        cold = by_name.get(recipe.cache_from) if recipe is not None and recipe.cache_from else None
        if row.status != "ok" or cold is None:
            continue
        w, c = row.metrics, cold.metrics
        if not c.first_step_s or w.first_step_s is None:
            continue
        warm_total = w.first_step_s + (w.cache.load_s or 0.0)
        build = ""
        if w.build_s is not None and c.build_s is not None:
            warm_all = (w.import_compiler_s or 0.0) + warm_total + w.build_s
            cold_all = (c.import_compiler_s or 0.0) + c.first_step_s + c.build_s
            build = (
                f" (model build {w.build_s:.2f} s warm, {c.build_s:.2f} s cold; whole restart "
                f"{warm_all:.2f} s ÷ {cold_all:.2f} s = {warm_all / cold_all:.3f})"
            )
        unquotable = [
            f"{r.name}: {'; '.join(r.metrics.not_quotable)}"
            for r in (row, cold)
            if r.metrics.not_quotable
        ]
        caveat = (
            (
                " — NOT QUOTABLE, derived from a row measured under load "
                f"({' | '.join(unquotable)});"
                f" re-run on a quiet machine"
            )
            if unquotable
            else ""
        )
        path = restart_path(w)
        collector = (
            f"; of its first step, {w.first_step_gc_s:.2f} s was Python's garbage collector"
            if (w.first_step_gc_s or 0.0) >= 0.05
            else ""
        )  # a pause of any step, not the cache's
        lines.append(
            f"{row.name}: cache load {w.cache.load_s or 0.0:.2f} s + first step "
            f"{w.first_step_s:.2f} s = {warm_total:.2f} s; cold first step ({cold.name}) "
            f"{c.first_step_s:.2f} s; warm ÷ cold {warm_total / c.first_step_s:.3f}{build}"
            + (f"; path: {path}" if path else "")
            + collector
            + caveat
        )
    return lines


def background_lines(rows: Sequence[RecipeResult], all_rows: Sequence[RecipeResult]) -> list[str]:
    """For each background-compile row (``compile_in_background``): when it switched, the stall
    against the cold compile of the same recipe, and the time to reach each step ÷ the better of
    ``eager`` and that cold row (unpaired rows only: a paired row's clock runs its baseline's blocks
    too).

    Example:
        >>> bg = RecipeResult(name="regional-background", status="ok", metrics=Metrics(
        ...     step_ends_s=[1.0, 2.0, 2.5], background=BackgroundUse(state="compiled",
        ...     eager_steps=2, switched_at_call=3, worker_s=2.0, stall_s=0.3)))
        >>> cold = RecipeResult(name="regional", status="ok", metrics=Metrics(
        ...     first_step_s=10.0, step_ends_s=[10.0, 10.5, 11.0]))
        >>> eager = RecipeResult(name="eager", status="ok", metrics=Metrics(step_ends_s=[1.0, 2.0,
        ...     3.0]))
        >>> background_lines([bg], [eager, cold, bg])[0]  # doctest: +NORMALIZE_WHITESPACE
        'regional-background: compiled from step 3 after 2 eager steps (worker 2.0 s; handoff of the
        first batch 0.000 s; stall at the switch 0.30 s = 0.030 of the cold compile of regional);
        time to reach step n ÷ the better of eager and regional, steps 1–3: at most 1.000 (step 1),
        at least 0.833 (step 3)'
    """
    by_name = {row.name: row for row in all_rows if row.status == "ok"}
    lines = []
    for row in rows:
        record = row.metrics.background if row.status == "ok" else None
        if not record:
            continue
        cold = by_name.get(row.name.removesuffix("-background"))
        if record.switched_at_call is None:
            reason = f": {record.eager_reason}" if record.eager_reason else ""
            lines.append(f"{row.name}: {record.state}{reason} ({record.eager_steps} eager steps)")
            continue
        text = (
            f"{row.name}: compiled from step {record.switched_at_call} after "
            f"{record.eager_steps} eager steps (worker {record.worker_s or 0.0:.1f} s; handoff of "
            f"the first batch {record.handoff_s or 0.0:.3f} s; stall at the switch "
            f"{record.stall_s or 0.0:.2f} s"
        )
        if cold is not None and cold.metrics.first_step_s:
            text += (
                f" = {(record.stall_s or 0.0) / cold.metrics.first_step_s:.3f} of the cold "
                f"compile of {cold.name}"
            )
        text += ")"
        eager = by_name.get("eager")
        curves = [r.metrics for r in (row, eager, cold) if r is not None]
        if len(curves) == 3 and all(m.step_ends_s and m.paired is None for m in curves):
            mine, *others = (m.step_ends_s for m in curves)
            n = min(len(mine), *(len(o) for o in others))
            ratios = [mine[i] / min(o[i] for o in others) for i in range(n)]
            worst, best = (
                max(range(n), key=ratios.__getitem__),
                min(range(n), key=ratios.__getitem__),
            )
            text += (
                f"; time to reach step n ÷ the better of eager and {cold.name}, steps 1–{n}: at "
                "most "
                f"{ratios[worst]:.3f} (step {worst + 1}), at least {ratios[best]:.3f} (step "
                f"{best + 1})"
            )
        elif eager is not None and cold is not None:
            text += "; time to reach each step: run the three rows with --no-pair to compare"
        lines.append(text)
    return lines


def format_comparison(
    first: BenchResults,
    second: BenchResults,
    *,
    labels: Sequence[str] = ("A", "B"),
    markdown: bool = False,
) -> str:
    """Two runs side by side (warm-up seconds, steps/s, B ÷ A per recipe), as text or Markdown."""
    a_rows = {row.name: row.metrics for row in first.rows}
    b_rows = {row.name: row.metrics for row in second.rows}
    names = list(a_rows) + [n for n in b_rows if n not in a_rows]
    a, b = labels
    header = [
        "recipe",
        f"warm-up s {a}",
        f"warm-up s {b}",
        f"{b} ÷ {a}",
        f"steps/s {a}",
        f"steps/s {b}",
        f"{b} ÷ {a}",
    ]
    body = []
    for name in names:
        cells = [name]
        for key, fmt in (("warmup_s", "{:.1f}"), ("steps_per_s", "{:.2f}")):
            va = getattr(a_rows.get(name), key, None)
            vb = getattr(b_rows.get(name), key, None)
            cells += [
                _cell(va, fmt),
                _cell(vb, fmt),
                _cell(vb / va if va and vb else None, "{:.2f}"),
            ]
        body.append(cells)
    lines = []
    for label, doc in ((a, first), (b, second)):
        env, settings = doc.environment, doc.settings
        lines.append(
            f"{label}: {settings.get('model')}, preset {settings.get('preset')}, "
            f"{env.get('device')}, torch {env.get('torch')}, {env.get('date', '')[:10]}, "
            f"commit {env.get('git_commit')}"
        )
    return "\n".join([*lines, "", render_table(header, body, markdown=markdown)])
