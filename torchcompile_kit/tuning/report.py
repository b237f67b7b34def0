"""How ``tune`` shows what it found: the ranked table, the reason (the winner's gain and
break-even, and what each faster loser would need), and a chart.
"""

from __future__ import annotations

import math
import random
from pathlib import Path

from ..bench import render_table
from ..shapes import Batching, estimate_padding, plan_buckets
from .result import CandidateResult, PredictionCheck, TuneResult

__all__ = [
    "bucket_notes",
    "format_table",
    "prediction_line",
    "recommendation_reason",
    "write_chart",
]


def _num(value: float | None, fmt: str) -> str:
    if value is None:
        return "-"
    if isinstance(value, float) and math.isinf(value):
        return "never"
    return format(value, fmt)


def _steps(value: float | None) -> str:
    if value is None:
        return "-"
    return "never" if math.isinf(value) else f"{int(value):,}"


def _interval(c: CandidateResult) -> str:
    if c.speedup is not None and c.speedup.interval():
        return c.speedup.interval()
    return "-" if c.paired or c.verdict == "eager" or c.status != "ok" else "unpaired"


def _margin(c: CandidateResult) -> str:
    """``1.17x eager per step (95% interval 1.12–1.22)``."""
    text = f"{c.speedup.ratio:.2f}x eager per step"
    if c.speedup.interval():
        text += f" (95% interval {c.speedup.interval()})"
    return text


def _indistinguishable(
    chosen: CandidateResult, candidates: list[CandidateResult], steps_planned: int
) -> str:
    """The candidates the measurement cannot tell from the recommendation, with their totals."""
    by_name = {c.name: c for c in candidates}
    others = [
        by_name[n] for n in chosen.indistinguishable_from if n in by_name and by_name[n].eligible
    ]
    if not others:
        return ""

    def total(c: CandidateResult) -> str:
        if c.predicted_total_low_s is None:
            return f"{c.name} {c.predicted_total_s:,.0f} s"
        return f"{c.name} {c.predicted_total_low_s:,.0f}–{c.predicted_total_high_s:,.0f} s"

    return (
        f"; not distinguishable from {', '.join(c.name for c in others)} at {steps_planned:,} "
        "steps "
        f"(predicted {', '.join(total(c) for c in [chosen, *others])}: the intervals overlap, "
        "so either will do; --steps or --steady-seconds narrow them)"
    )


def format_table(result: TuneResult) -> str:
    """The ranked table as fixed-width text, the recommendation marked with ``*``."""
    header = [
        "#",
        "candidate",
        "status",
        "check",
        "compile s",
        "step ms",
        "x eager",
        "95% interval",
        "break-even",
        f"total s @{result.steps_planned:,}",
        "graphs",
        "recomp",
        "breaks",
        "note",
    ]
    rows = []
    for rank, c in enumerate(result.candidates, 1):
        mark = "*" if c.name == result.recommendation else ""
        note = c.offending if c.verdict == "fail" else (c.reason or "")
        if c.restart and c.status == "ok":
            note = note or "warm restart (loads a saved cache)"
        if c.indistinguishable_from:
            note = f"≈ {', '.join(c.indistinguishable_from)}" + (f"; {note}" if note else "")
        step_ms = None if c.step_s is None else c.step_s * 1e3
        rows.append(
            [
                f"{rank}{mark}",
                c.name,
                c.status,
                c.verdict,
                _num(c.compile_s, ".1f"),
                _num(step_ms, ".2f"),
                _num(c.speedup.ratio if c.speedup else None, ".2f"),
                _interval(c),
                _steps(c.break_even_steps),
                _num(c.predicted_total_s, ".1f"),
                _num(c.metrics.graphs, "d"),
                _num(c.metrics.recompiles, "d"),
                _num(c.metrics.graph_breaks, "d"),
                note[:90],
            ]
        )
    return render_table(header, rows)


def recommendation_reason(
    chosen: CandidateResult | None,
    candidates: list[CandidateResult],
    steps_planned: int,
    *,
    shortfall: str | None = None,
) -> str:
    """One or two sentences: why ``chosen`` (``None``: nothing measured) wins a run of
    ``steps_planned`` steps, with ``shortfall`` appended when the budget ran out.

    Example:
        >>> recommendation_reason(None, [], 100)  # doctest: +NORMALIZE_WHITESPACE
        'nothing could be measured: no candidate ran (see the table for the reasons)'
    """
    if chosen is None:
        text = "nothing could be measured: no candidate ran (see the table for the reasons)"
        return f"{text}; {shortfall}" if shortfall else text
    compiled_ran = any(c.status == "ok" and c.verdict != "eager" for c in candidates)
    losers = [
        c
        for c in candidates
        if c is not chosen
        and c.eligible
        and c.speedup is not None
        and c.speedup.ratio > 1
        and c.break_even_steps is not None
        and c.break_even_steps > steps_planned
    ]
    wrong = [c for c in candidates if c.verdict == "fail"]
    faster_unchecked = sorted(
        (
            c
            for c in candidates
            if c is not chosen
            and c.verdict == "unchecked"
            and c.predicted_total_s is not None
            and chosen.predicted_total_s is not None
            and c.predicted_total_s < chosen.predicted_total_s
        ),
        key=lambda c: c.predicted_total_s,
    )
    if chosen.verdict == "eager" and faster_unchecked:
        text = (
            f"{chosen.name}: the lowest predicted total among the recipes checked for correctness"
        )
    elif chosen.verdict == "eager" and not compiled_ran and shortfall:
        text = f"{chosen.name}: the only recipe measured"
    elif (
        chosen.verdict == "eager"
        and not compiled_ran
        and not any(c.status == "pruned" for c in candidates)
    ):
        text = f"{chosen.name}: no compiled recipe ran (see the table for the reasons)"
    elif chosen.verdict == "eager":
        text = (
            f"{chosen.name}: no compiled recipe pays back its compile time within "
            f"{steps_planned:,} steps"
        )
    elif chosen.speedup is None:  # eager itself did not run: nothing to compare with
        text = (
            f"{chosen.name}: the lowest predicted total for {steps_planned:,} steps (eager "
            "not measured)"
        )
    elif not chosen.break_even_steps:
        text = (
            f"{chosen.name}: {_margin(chosen)}, and its one-off cost is no more "
            "than eager's: ahead from the first step"
        )
    else:
        text = (
            f"{chosen.name}: {_margin(chosen)}, pays back its "
            f"{chosen.compile_s:.0f} s compile after ~{_steps(chosen.break_even_steps)} steps "
            f"(of {steps_planned:,} planned)"
        )
    for c in sorted(losers, key=lambda c: c.break_even_steps)[:2]:
        text += (
            f"; {c.name} ({c.speedup.ratio:.2g}x per step) needs {_steps(c.break_even_steps)} "
            "steps to pay back its compile time"
        )
    if faster_unchecked:
        best = faster_unchecked[0]
        text += (
            f"; {best.name} is predicted faster ({best.predicted_total_s:,.0f} s vs "
            f"{chosen.predicted_total_s:,.0f} s for {steps_planned:,} steps) but was not checked "
            "against eager (its run reported no correctness check), so it is not recommended"
        )
    text += _indistinguishable(chosen, candidates, steps_planned)
    if wrong:
        text += "; not recommended because it computes different numbers: " + ", ".join(
            c.name for c in wrong
        )
    return f"{text}; {shortfall}" if shortfall else text


def save_result(result: TuneResult, out_dir: str | Path) -> Path:
    """Write ``tune.json`` (:meth:`TuneResult.write_json`), ``tune.png`` (the chart),
    ``recommended.py`` (the snippet) and ``tune.txt`` (the table and the reason) into ``out_dir``
    (created if missing) and return it.

    Example:
        >>> save_result(result, "tune-out")  # doctest: +SKIP
    """
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    result.write_json(out / "tune.json")
    write_chart(result, out / "tune.png")
    (out / "recommended.py").write_text(result.snippet)
    (out / "tune.txt").write_text(format_table(result) + "\n\n" + result.reason + "\n")
    return out


def write_chart(result: TuneResult, path: str | Path) -> Path | None:
    """Predicted wall time against steps for every measured candidate, as a PNG at ``path``
    (``None`` without matplotlib or a measured candidate); lines cross at the break-even points."""
    measured = [c for c in result.candidates if c.status == "ok" and c.step_s is not None]
    if not measured:
        return None
    try:
        from matplotlib.figure import Figure  # a private figure: no pyplot, no global backend
    except ImportError:
        return None
    horizon = max(2 * result.steps_planned, 10)
    fig = Figure(figsize=(8, 4.5))
    ax = fig.add_subplot()
    for c in measured:
        style = "--" if c.restart else ("-" if c.verdict != "fail" else ":")
        overhead = (c.compile_s or 0.0) + (c.recompile_s or 0.0)
        (line,) = ax.plot(
            [0, horizon],
            [overhead, overhead + horizon * c.step_s],
            style,
            lw=2.5 if c.name == result.recommendation else 1.2,
            label=c.name + (" (wrong results)" if c.verdict == "fail" else ""),
        )
        speedup = c.speedup
        if speedup is not None and speedup.low is not None:  # the 95% interval of its ratio
            fast = c.step_s * speedup.ratio / speedup.high
            slow = c.step_s * speedup.ratio / speedup.low
            ax.fill_between(
                [0, horizon],
                [overhead, overhead + horizon * fast],
                [overhead, overhead + horizon * slow],
                color=line.get_color(),
                alpha=0.15,
                lw=0,
            )
    ax.axvline(result.steps_planned, color="grey", ls="--", lw=1)
    ax.set_xlabel("training steps")
    ax.set_ylabel("predicted wall time, s")
    ax.set_title(f"tune: recommendation {result.recommendation} for {result.steps_planned:,} steps")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    return Path(path)


def bucket_notes(
    lengths: list[int] | None, batch_size: int, measured_buckets: list[int] | None = None
) -> list[str]:
    """What the user's own lengths say about buckets vs pad-to-longest (counts, not timings), and
    what the timed ``buckets`` row padded to (``measured_buckets``); no note without lengths.

    Example:
        >>> bucket_notes(None, 64)
        []
    """
    if not lengths:
        return []
    batching = Batching(batch_size, drop_last=True)
    buckets = plan_buckets(lengths, max_buckets=8, batching=batching)
    in_buckets = estimate_padding(lengths, buckets, batching=batching)
    shuffled = random.Random(0).sample(lengths, len(lengths))
    real = computed = 0
    for i in range(0, len(shuffled) - batch_size + 1, batch_size):  # random, pad to longest (x8)
        chunk = shuffled[i : i + batch_size]
        real += sum(chunk)
        computed += len(chunk) * -(-max(chunk) // 8) * 8
    longest = f"{1 - real / computed:.1%}" if computed else "-"
    note = (
        f"your lengths ({len(lengths):,}, batch {batch_size}): plan_buckets(batching="
        f"Batching({batch_size})) gives {buckets} with {in_buckets:.1%} padding in "
        f"BucketBatchSampler batches, vs {longest} for random batches padded to their longest "
        "(multiple of 8), from counts"
    )
    if measured_buckets is not None:
        note += (
            f"; the timed 'buckets' row is your make_batch batches each padded up to the "
            f"smallest of {measured_buckets} that fits (no sampler groups lengths there, so "
            "it pads more than BucketBatchSampler batches would)"
        )
    return [note]


def prediction_line(check: PredictionCheck) -> str:
    """One line for ``TuneResult.prediction_check``: predicted against measured, and how steady the
    run was.

    Example:
        >>> prediction_line(PredictionCheck(status="ok", recipe="eager", steps=100,
        ...     predicted_s=9.0, measured_s=10.0, ratio=0.9))  # doctest: +NORMALIZE_WHITESPACE
        'prediction check: eager for 100 steps: predicted 9.0 s, measured 10.0 s (predicted ÷
        measured 0.90)'
    """
    if check.status != "ok":
        return f"prediction check: {check.status}: {check.error}"
    line = (
        f"prediction check: {check.recipe} for {check.steps:,} steps: predicted "
        f"{check.predicted_s:.1f} s, measured {check.measured_s:.1f} s "
        f"(predicted ÷ measured {check.ratio:.2f})"
    )
    if check.steadiness is not None:
        line += f"; {check.steadiness.note}"
    if check.cpu_steal is not None:
        line += f"; the hypervisor took {check.cpu_steal:.0%} of the CPU time meanwhile (steal)"
    return line
