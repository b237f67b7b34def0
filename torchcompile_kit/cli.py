"""Command line: ``torchcompile-kit bench | report | tune | doctor`` (also ``python -m
torchcompile_kit``).

Nothing in the package imports this module.
"""

from __future__ import annotations

import argparse
import dataclasses
import logging
import os
import shlex
import sys
from pathlib import Path
from typing import Any

from .bench.recipes import RECIPES


def _recipe_list() -> str:
    lines = []
    for group in dict.fromkeys(r.group for r in RECIPES.values()):
        lines.append(f"  {group}:")
        for r in RECIPES.values():
            if r.group == group:
                flag = "+" if not r.default else "*" if r.heavy_on else " "
                lines.append(f"   {flag} {r.name:18s} {r.description}")
    lines.append(
        "  (+ = opt-in: name it, or --all; * = opt-in on CPU, where its compile takes minutes)"
    )
    return "\n".join(lines)


def _number(kind: type, *, minimum: float, strict: bool):
    """An argparse ``type=``: ``kind`` of the value, refused (naming the flag) below ``minimum``."""

    def parse(text: str):
        value = kind(text)
        if value < minimum or (strict and value == minimum):
            raise argparse.ArgumentTypeError(
                f"must be {'>' if strict else '>='} {minimum}, got {text}"
            )
        return value

    parse.__name__ = kind.__name__  # argparse's "invalid int value" message
    return parse


_POSITIVE_INT = _number(int, minimum=0, strict=True)
_POSITIVE_FLOAT = _number(float, minimum=0, strict=True)
_SECONDS = _number(float, minimum=0, strict=False)


def _pin(text: str) -> str:
    """An argparse ``type=`` for ``--pin TRAIN:COMPILE`` (``MeasureConfig.pin``'s check)."""
    from .bench.config import MeasureConfig

    try:
        train, compile_ = MeasureConfig(pin=text).pinned_cpus()
    except ValueError as err:
        raise argparse.ArgumentTypeError(str(err)) from err
    if not hasattr(os, "sched_getaffinity"):  # macOS, Windows: nothing to check against
        return text
    available = sorted(os.sched_getaffinity(0))
    missing = sorted(set(train + compile_) - set(available))
    if missing:
        raise argparse.ArgumentTypeError(
            f"CPU(s) {missing} are not available to this process (it may "
            f"use CPUs {available}); pass TRAIN:COMPILE lists of those"
        )
    return text


def _measure_flags(parser: argparse.ArgumentParser, row: str) -> None:
    """The flags bench and tune share: the model, the steps timed, pairing, the device."""
    parser.add_argument(
        "--model",
        default=None,
        metavar="MODULE:FUNCTION",
        help="your model: FUNCTION() returns (model, make_batch[, lengths]); see "
        "docs/benchmarks.md (default: the post's captioner at --preset)",
    )
    parser.add_argument(
        "--steps",
        type=_POSITIVE_INT,
        default=None,
        help=f"steady steps timed per {row} (default: the preset's)",
    )
    parser.add_argument(
        "--warmup-steps",
        type=_POSITIVE_INT,
        default=None,
        help="steps timed as warm-up (default: the preset's)",
    )
    parser.add_argument(
        "--no-pair",
        action="store_true",
        help=f"time each {row} alone, without an eager copy stepping beside it (half the memory; "
        "ratios then divide runs measured minutes apart: not robust to load)",
    )
    parser.add_argument(
        "--device",
        choices=("cpu", "cuda"),
        default=None,
        help=f"where every {row} trains (default: $TORCHCOMPILE_KIT_BENCH_DEVICE, else cuda when "
        "a GPU is visible, else cpu)",
    )
    # test switch (documented in docs/benchmarks.md): a cheap compile backend such as "eager"
    parser.add_argument("--backend", default=None, help=argparse.SUPPRESS)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="torchcompile-kit",
        description="Measure, on this machine, what each torch.compile recipe buys.",
    )
    sub = parser.add_subparsers(dest="command", required=True)
    bench = sub.add_parser(
        "bench",
        help="run the post's torch.compile experiment recipe by recipe (table, results.json, "
        "charts)",
        description="Recipes (each runs in its own process with an empty inductor cache):\n"
        + _recipe_list(),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    bench.add_argument(
        "recipes", nargs="*", metavar="RECIPE", help="recipes to run (default: the default set)"
    )
    bench.add_argument("--list", action="store_true", help="list the recipes and exit")
    bench.add_argument("--all", action="store_true", help="run every recipe, opt-in ones included")
    bench.add_argument(
        "--ddp", action="store_true", help="also run DDP with 2 processes (gloo on CPU)"
    )
    bench.add_argument(
        "--preset",
        default=None,
        choices=("tiny", "full-size"),
        help="model and step sizes: tiny (default on CPU, <= 15 min on 2 cores) or full-size "
        "(the post's sizes; default on CUDA)",
    )
    bench.add_argument(
        "--out",
        default="bench-results",
        metavar="DIR",
        help="where results.json, charts and logs go (default: %(default)s)",
    )
    bench.add_argument(
        "--timeout",
        type=_POSITIVE_FLOAT,
        default=None,
        metavar="S",
        help="fail a recipe that runs longer than S seconds",
    )
    bench.add_argument(
        "--repeat",
        type=_POSITIVE_INT,
        default=1,
        metavar="N",
        help="run every row N times, in rounds, and pool their paired blocks (a narrower interval; "
        "load in one round is outvoted); warm-up s is the median (default: %(default)s)",
    )
    bench.add_argument(
        "--pin",
        type=_pin,
        default=None,
        metavar="TRAIN:COMPILE",
        help="CPU lists, e.g. 0:1: every row trains on the TRAIN CPUs (as many torch threads), a "
        "background compile's worker runs on the COMPILE CPUs (default: all CPUs for everything)",
    )
    bench.add_argument("--markdown", action="store_true", help="print the tables as Markdown")
    bench.add_argument("--no-charts", action="store_true", help="do not write PNG charts")
    _measure_flags(bench, "row")

    report = sub.add_parser(
        "report", help="re-render the table and charts of saved results (two side by side)"
    )
    report.add_argument(
        "runs",
        nargs="+",
        metavar="DIR",
        help="a bench --out directory (or its results.json); two to compare",
    )
    report.add_argument("--markdown", action="store_true", help="print Markdown tables")
    report.add_argument("--no-charts", action="store_true", help="do not write PNG charts")
    report.add_argument(
        "--charts-dir",
        default=None,
        metavar="DIR",
        help="where to write charts (default: the first DIR)",
    )

    tune = sub.add_parser(
        "tune",
        help="find the fastest recipe that is still correct for your model and run length",
        description="Runs candidate recipes on your model, each from a cold start in its own "
        "process, checks "
        "each against eager, and recommends the one with the lowest predicted wall time for "
        "--steps-planned steps.",
    )
    tune.add_argument(
        "--steps-planned",
        type=_POSITIVE_INT,
        default=1000,
        metavar="N",
        help="steps of the run you plan (default: %(default)s)",
    )
    tune.add_argument(
        "--budget",
        type=_POSITIVE_FLOAT,
        default=30.0,
        metavar="MINUTES",
        help="time tune may spend (default: %(default)s)",
    )
    tune.add_argument(
        "--out",
        default="tune-results",
        metavar="DIR",
        help="tune.json, tune.txt, tune.png, recommended.py (default: %(default)s)",
    )
    tune.add_argument(
        "--candidates",
        nargs="+",
        default=None,
        metavar="NAME",
        help="candidates to consider (default: all)",
    )
    tune.add_argument(
        "--preset",
        default="tiny",
        choices=("tiny", "full-size"),
        help="captioner sizes and default step counts",
    )
    tune.add_argument(
        "--steady-seconds",
        type=_SECONDS,
        default=None,
        metavar="S",
        help="time each candidate's steady steps for at least S seconds (default: 30)",
    )
    tune.add_argument(
        "--warm-start",
        action="store_true",
        help="you restart from a saved compile cache: rank the warm restarts",
    )
    tune.add_argument(
        "--check-prediction",
        action="store_true",
        help="then run the recommendation for N steps: predicted vs measured total",
    )
    _measure_flags(tune, "candidate")

    doctor = sub.add_parser(
        "doctor",
        help="when torch.compile crashes or miscomputes: at which backend, under which "
        "settings and in which module (experimental)",
        description="Triage (your model compiled whole, forward, loss, gradients and one step "
        "judged against eager), then the backend ladder, the inductor settings that hide it, and "
        "the smallest module whose compile alone reproduces it, confirmed both ways; each trial "
        "in its own process. Writes DIR/doctor.json, DIR/doctor_repro.py and each trial's log.",
    )
    doctor.add_argument(
        "--model",
        required=True,
        metavar="MODULE:FUNCTION",
        help="your model, as for bench --model: build() -> (model, make_batch)",
    )
    doctor.add_argument(
        "--out",
        default="doctor-results",
        metavar="DIR",
        help="where the record goes (default: %(default)s)",
    )
    doctor.add_argument(
        "--backend",
        default="inductor",
        help="the backend you compile with, a name or MODULE:ATTRIBUTE (default: %(default)s)",
    )
    doctor.add_argument(
        "--recipe",
        choices=("regional", "model", "peft"),
        default=None,
        help="diagnose this library's compile_regional / compile_model / compile_peft "
        "instead of torch.compile(model) (default: torch.compile)",
    )
    doctor.add_argument(
        "--dynamic",
        choices=("true", "false"),
        default=None,
        help="the dynamic= you compile with (default: torch's, automatic)",
    )
    doctor.add_argument(
        "--autocast",
        choices=("bfloat16", "float16"),
        default=None,
        help="run under torch.autocast with this dtype, as you train (default: none)",
    )
    doctor.add_argument(
        "--timeout",
        type=_POSITIVE_FLOAT,
        default=600.0,
        metavar="S",
        help="seconds one trial may run before it counts as hung (default: %(default)s)",
    )
    return parser


def _error(message: str) -> int:
    print(f"torchcompile-kit: error: {message}", file=sys.stderr)
    return 2


def _check_out_dir(out: str) -> str | None:
    path = Path(out)
    try:
        path.mkdir(parents=True, exist_ok=True)
        probe = path / ".tck-write-probe"
        probe.write_text("")
        probe.unlink()
    except OSError as err:
        return (
            f"--out {out!r} is not a writable directory ({err.strerror or err}); pass another "
            "--out DIR"
        )
    return None


def _bench(args: argparse.Namespace) -> int:
    from .bench.config import MeasureConfig
    from .bench.recipes import (
        UnknownRecipeError,
        check_recipe_names,
        default_recipe_names,
        with_dependencies,
    )

    if args.list:
        print(_recipe_list())
        return 0
    try:  # before torch is imported: a typo is answered at once
        names = check_recipe_names(args.recipes)
    except UnknownRecipeError as err:
        return _error(str(err))
    try:
        device_type = MeasureConfig(device=args.device).device_or_default()
    except ValueError as err:
        return _error(str(err))
    config = MeasureConfig(
        preset=args.preset or ("full-size" if device_type == "cuda" else "tiny"),
        backend=args.backend,
        steps=args.steps,
        warmup_steps=args.warmup_steps,
        paired=not args.no_pair,
        device=device_type,
        pin=args.pin,
    )
    config = dataclasses.replace(config, backend=config.backend_or_default())  # recorded as run
    if not names:
        names = list(RECIPES) if args.all else default_recipe_names(device_type=device_type)
    if args.ddp and "ddp" not in names:
        names.append("ddp")
    planned = with_dependencies(names)
    added = [n for n in planned if n not in names]
    if (message := _check_out_dir(args.out)) is not None:
        return _error(message)
    if args.model:
        from .bench.model_spec import ModelSpecError, load_model_spec

        try:
            load_model_spec(args.model)  # fail fast here rather than once per recipe
        except ModelSpecError as err:
            return _error(str(err))
    if added:
        print(f"also running {added} (the warm recipes load the cache it saves)", file=sys.stderr)
    return _run_bench(args, planned, config)


def _run_bench(args: argparse.Namespace, names: list[str], config: Any) -> int:
    from .bench.charts import charts_available, write_charts
    from .bench.paired import merge_repeats
    from .bench.progress import BenchProgress
    from .bench.report import format_results
    from .bench.results import build_results, now, write_results
    from .bench.runner import RunRequest, run_recipe_isolated

    started = now()
    settings = {
        **config.as_dict(),
        "steps": config.steps_or_preset(),
        "warmup_steps": config.warmup_steps_or_preset(),
        "model": args.model or f"captioner:{config.preset}",
        "recipes": names,
        "repeat": args.repeat,
        "command": "torchcompile-kit " + shlex.join(args.argv),
    }
    runs: dict[str, list] = {name: [] for name in names}

    def save(complete: bool) -> tuple[Any, Path]:
        """results.json (and the charts) of the rows so far: an interrupted run leaves them."""
        results = [merge_repeats(runs[name]) for name in names if runs[name]]
        document = build_results(results, settings=settings, started=started, complete=complete)
        path = write_results(args.out, document)
        if not args.no_charts and charts_available():
            write_charts(document, args.out)
        return document, path

    with BenchProgress(total_recipes=len(names) * args.repeat) as progress:
        for round_ in range(args.repeat):  # rounds, so that each row's runs are spread in time
            for name in names:
                label = name if args.repeat == 1 else f"{name} ({round_ + 1}/{args.repeat})"
                on_event = progress.start(label)
                request = RunRequest(
                    recipe=name,
                    spec=args.model,
                    config=config,
                    pair_with=RECIPES[name].baseline if config.paired else None,
                )
                result = run_recipe_isolated(
                    request, out_dir=args.out, timeout_s=args.timeout, on_event=on_event
                )
                runs[name].append(result)
                progress.finish(label, _summary(result))
                if round_ == args.repeat - 1 and name != names[-1]:
                    save(complete=False)
    document, path = save(complete=True)
    print(format_results(document, markdown=args.markdown))
    print(f"\nresults: {path}")
    if not args.no_charts:
        charts = write_charts(document, args.out) if charts_available() else []
        if charts:
            print("charts: " + ", ".join(str(c) for c in charts))
        elif not charts_available():
            print("charts: not written (matplotlib is not installed: pip install -e '.[bench]')")
    return 0


def _summary(result) -> str:
    if result.status == "ok":
        from .bench.paired import paired_ratio

        m = result.metrics
        text = f"ok: warm-up {m.warmup_s or 0:.1f} s, {m.steps_per_s or 0:.2f} steps/s"
        ratio = paired_ratio(m)
        if ratio is not None:
            text += f", {ratio.ratio:.2f}× {ratio.baseline}"
            if ratio.interval():
                text += f" ({ratio.interval()})"
        return text
    if result.status == "skipped":
        return f"skipped: {result.reason}"
    first = (result.error or "").strip().splitlines()
    return f"FAILED: {first[0] if first else ''}"[:200]


def _report(args: argparse.Namespace) -> int:
    from .bench.charts import write_charts, write_comparison_chart
    from .bench.report import format_comparison, format_results
    from .bench.results import ResultsFileError, load_results

    if len(args.runs) > 2:
        return _error(
            f"report takes one or two result directories, got {len(args.runs)}: {args.runs!r}"
        )
    try:
        documents = [load_results(run) for run in args.runs]
    except ResultsFileError as err:
        return _error(str(err))
    charts_dir = Path(
        args.charts_dir
        or (args.runs[0] if Path(args.runs[0]).is_dir() else Path(args.runs[0]).parent)
    )
    for run, document in zip(args.runs, documents):
        if len(documents) > 1:
            print(f"### {run}")
        print(format_results(document, markdown=args.markdown))
        print()
    if len(documents) == 2:
        labels = [Path(run).name or run for run in args.runs]
        if labels[0] == labels[1]:
            labels = ["A", "B"]
        print(format_comparison(*documents, labels=labels, markdown=args.markdown))
    if not args.no_charts:
        if (message := _check_out_dir(str(charts_dir))) is not None:
            return _error(message)
        charts = write_charts(documents[0], charts_dir) if len(documents) == 1 else []
        if len(documents) == 2:
            chart = write_comparison_chart(*documents, charts_dir / "comparison.png", labels=labels)
            charts = [chart] if chart else []
        if charts:
            print("charts: " + ", ".join(str(c) for c in charts))
    return 0


def main(argv: list[str] | None = None) -> int:
    """Entry point of ``torchcompile-kit``: 0 on success (a failed recipe is a row of the table),
    2 on bad arguments."""
    argv = list(sys.argv[1:] if argv is None else argv)
    args = _parser().parse_args(argv)
    args.argv = argv
    if args.command == "bench":
        return _bench(args)
    if args.command == "report":
        return _report(args)
    if args.command == "doctor":
        return _doctor(args)
    return _tune(args)


def _doctor(args: argparse.Namespace) -> int:
    from ._factory import check_factory
    from .bench.model_spec import ModelSpecError
    from .doctor import EXIT_CODES, diagnose

    try:
        check_factory(args.model, error=ModelSpecError)
        if ":" in args.backend:
            check_factory(args.backend, error=ModelSpecError, flag="--backend")
    except ModelSpecError as err:
        return _error(str(err))
    kwargs = {"backend": args.backend}
    if args.dynamic is not None:
        kwargs["dynamic"] = args.dynamic == "true"
    try:
        diagnosis = diagnose(
            args.model,
            recipe=args.recipe,
            autocast=args.autocast,
            out=args.out,
            timeout_s=args.timeout,
            **kwargs,
        )
    except (ValueError, TypeError) as err:
        return _error(str(err))
    print(diagnosis.summary())
    print(f"\nrecord: {Path(args.out) / 'doctor.json'}")
    code = EXIT_CODES[diagnosis.result]
    print(f"exit status {code} ({diagnosis.result}; the codes: docs/troubleshooting.md)")
    return code


def _tune(args: argparse.Namespace) -> int:
    from .bench.config import MeasureConfig
    from .tuning import (
        STEADY_S,
        check_prediction,
        format_table,
        prediction_line,
        save_result,
        tune,
    )

    problem = _check_out_dir(args.out)
    if problem:
        return _error(problem)
    progress = logging.StreamHandler(sys.stderr)  # tune's progress: a line per candidate
    progress.setFormatter(logging.Formatter("[tune] %(message)s"))
    logger = logging.getLogger("torchcompile_kit.tuning")
    logger.addHandler(progress)
    level = logger.level
    logger.setLevel(logging.INFO)
    try:
        measure = MeasureConfig(
            preset=args.preset,
            backend=args.backend,
            steps=args.steps,
            warmup_steps=args.warmup_steps,
            steady_s=STEADY_S if args.steady_seconds is None else args.steady_seconds,
            paired=not args.no_pair,
            device=args.device,
        )
        result = tune(
            args.model,
            steps_planned=args.steps_planned,
            warm_start=args.warm_start,
            candidates=args.candidates,
            budget_s=60 * args.budget,
            measure=measure,
        )
        if args.check_prediction and result.recommendation is not None:
            result.prediction_check = check_prediction(result)
    except ValueError as err:
        return _error(str(err))
    finally:
        logger.removeHandler(progress)
        logger.setLevel(level)
    save_result(result, args.out)
    print(format_table(result), "", f"recommendation: {result.reason}", *result.notes, sep="\n")
    if result.prediction_check:
        print(prediction_line(result.prediction_check))
    print(
        f"\n# --- {args.out}/recommended.py ---\n{result.snippet}\nwritten: "
        f"{args.out}/tune.json, tune.txt, tune.png, recommended.py"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
