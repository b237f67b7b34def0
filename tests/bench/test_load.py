"""The issue's demonstration: with a neighbour whose CPU load switches on and off during the run,
rows that run the same compiled code keep steady ratios to eager, and the loaded rows are marked.

The load is a busy loop in a process of the test's own, detached from this process tree (so it
counts as a neighbour, not as the row's own work), bounded in time, and killed at the end. The
machine may be shared with other jobs: the assertions are relations (marks follow the measured
neighbours' share; intervals overlap), never wall times.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

from torchcompile_kit.bench.paired import NEIGHBOUR_LIMIT, STEAL_LIMIT, WIDTH_LIMIT
from torchcompile_kit.bench.results import load_results
from torchcompile_kit.bench.runner import INPROCESS_ENV
from torchcompile_kit.cli import main

SPEC = "tests.bench.user_models:medium_lm"
# The load switches every 50 ms, so that even the shortest row (the unpaired eager baseline, a few
# tenths of a second on a fast machine) spans whole on/off cycles and sees its share of the load.
TOGGLE_S = 0.05

_BUSY = """
import sys, time
end, period = time.monotonic() + float(sys.argv[1]), float(sys.argv[2])
while time.monotonic() < end:
    now = time.monotonic()
    if int(now / period) % 2 == 0:
        while time.monotonic() - now < 0.01:
            pass
    else:
        time.sleep(0.01)
"""
# start the busy loop from a short-lived middle process, so that it is not this test's child
_DETACH = """
import subprocess, sys
proc = subprocess.Popen([sys.executable, "-c", sys.argv[1], sys.argv[2], sys.argv[3]],
                        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                        start_new_session=True)
print(proc.pid)
"""


@pytest.fixture
def switching_load():
    """A neighbour: one core busy for TOGGLE_S, idle for TOGGLE_S, ... for at most 120 s."""
    out = subprocess.run(
        [sys.executable, "-c", _DETACH, _BUSY, "120", str(TOGGLE_S)],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    ).stdout
    pid = int(out.strip())
    time.sleep(0.2)
    yield pid
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def _run(out):
    code = main(
        [
            "bench",
            "eager",
            "full",
            "full-warm",
            "--model",
            SPEC,
            "--steps",
            "240",
            "--warmup-steps",
            "2",
            "--backend",
            "eager",
            "--out",
            str(out),
            "--no-charts",
        ]
    )
    assert code == 0
    rows = {row.name: row for row in load_results(out).rows}
    assert all(row.status == "ok" for row in rows.values()), rows
    return {name: row.metrics for name, row in rows.items()}


@pytest.fixture(scope="module")
def quiet(tmp_path_factory):
    """The same rows without the test's load (other jobs on the machine may still run)."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv(INPROCESS_ENV, "1")
        return _run(tmp_path_factory.mktemp("quiet"))


def _share(m):
    return max(m.cpu_neighbours, m.cpu_neighbours_steady)


@pytest.mark.slow
def test_without_the_load_a_row_is_marked_only_for_what_was_measured(quiet):
    for name, m in quiet.items():
        speedup = m.speedup
        assert speedup.ratio > 0 and m.cpu_neighbours is not None
        assert bool(m.not_quotable) == (
            _share(m) > NEIGHBOUR_LIMIT
            or (m.cpu_steal or 0) > STEAL_LIMIT
            or (name != "eager" and (speedup.high - speedup.low) / speedup.ratio > WIDTH_LIMIT)
        ), (name, m.not_quotable)
        if _share(m) <= NEIGHBOUR_LIMIT and (m.cpu_steal or 0) <= STEAL_LIMIT and name != "eager":
            # nobody else on the machine and no hypervisor steal (a shared CI host has some,
            # measured
            # 7% once): the interval is narrow enough to quote
            assert m.not_quotable == [], (name, m.not_quotable)
    for name in ("full", "full-warm"):
        assert quiet[name].speedup.paired and quiet[name].speedup.blocks >= 20


@pytest.mark.slow
def test_a_switching_load_leaves_the_ratios_steady_and_marks_the_rows(
    quiet, tmp_path, monkeypatch, switching_load
):
    monkeypatch.setenv(INPROCESS_ENV, "1")
    loaded = _run(tmp_path / "loaded")
    for name, m in loaded.items():
        # the test's own neighbour took ~a quarter of the 2-core machine during every row
        assert _share(m) > NEIGHBOUR_LIMIT and m.not_quotable, (name, m)
        assert "other processes used" in m.not_quotable[0]
    full, warm = loaded["full"].speedup, loaded["full-warm"].speedup
    # the same compiled code twice: intervals that overlap each other ...
    assert full.low <= warm.high and warm.low <= full.high, (
        full,
        warm,
    )
    # ... and that hold the ratio measured without the test's load, within 10%
    for name in ("full", "full-warm"):
        low, high = loaded[name].speedup.low, loaded[name].speedup.high
        assert 0.9 * low <= quiet[name].speedup.ratio <= 1.1 * high, (name, loaded[name])
