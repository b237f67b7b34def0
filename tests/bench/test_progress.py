"""bench's progress when the output is not a terminal: lines inside a recipe, and an estimate."""

from __future__ import annotations

from torchcompile_kit.bench.progress import BenchProgress


def test_plain_progress_reports_inside_a_recipe_and_estimates_the_rest(capsys):
    """Under a file or CI log, bench printed one line per recipe and nothing while a recipe ran
    (recipes took up to 15 minutes on a loaded machine)."""
    with BenchProgress(total_recipes=2, interval_s=0.0) as progress:
        assert not progress.use_rich  # pytest's stderr is no terminal
        on_event = progress.start("full")
        on_event({"event": "phase", "phase": "compiling"})
        for step in (1, 2, 3):
            on_event({"event": "step", "step": step, "total": 3, "phase": "steady"})
        progress.finish("full", "ok")
    lines = capsys.readouterr().err.splitlines()
    assert lines[0] == "[1/2] full: starting"
    assert lines[1].startswith("[1/2] full: compiling (") and lines[1].endswith(" s)")
    assert [line.split(": ")[1].split(" (")[0] for line in lines[2:5]] == [
        "steady step 1/3",
        "steady step 2/3",
        "steady step 3/3",
    ]
    assert lines[5] == "[1/2] full: ok"
    assert lines[6].startswith("1 of 2 recipes done,") and "about" in lines[6]


def test_plain_step_lines_are_throttled(capsys):
    with BenchProgress(total_recipes=1, interval_s=3600.0) as progress:
        on_event = progress.start("eager")
        for step in range(1, 101):
            on_event({"event": "step", "step": step, "total": 100, "phase": "steady"})
    steps = [line for line in capsys.readouterr().err.splitlines() if "step" in line]
    assert steps == [steps[-1]] and "step 100/100" in steps[0]  # only the last, forced
