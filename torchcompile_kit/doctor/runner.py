"""Run a trial in a process of its own: a timeout, an empty inductor cache, its log kept, and a
process that dies (SIGSEGV, SIGFPE, SIGABRT) turned into an outcome, never a dead doctor."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from .record import Trial, TrialOutcome

__all__ = ["TrialRunner"]


class TrialRunner:
    """Starts each trial's process with the same saved weights, batch and seed.

    Args:
        work: the doctor's output folder (requests, outcomes and logs go under ``trials/``).
        inputs: what every request carries (``spec`` or ``model``, ``state``, ``batch``, ``seed``).
        timeout_s: seconds a trial may run before it is killed (``timeout``).

    Example:
        >>> runner = TrialRunner(Path("out"), {"spec": "m:build", ...}, timeout_s=600)  # doctest: +SKIP
        >>> runner.run(Trial(label="triage")).status  # doctest: +SKIP
        'ok'
    """

    def __init__(self, work: Path, inputs: dict[str, Any], *, timeout_s: float) -> None:
        self.folder = work / "trials"
        self.folder.mkdir(parents=True, exist_ok=True)
        self.inputs = inputs
        self.timeout_s = timeout_s
        self.count = 0

    def request(self, trial: Trial, name: str) -> dict[str, Any]:
        """The request the trial's process reads (also what a repro script replays)."""
        return {
            **self.inputs,
            "trial": trial.to_dict(),
            "stage": str(self.folder / f"{name}.stage"),
            "out": str(self.folder / f"{name}.json"),
        }

    def run(self, trial: Trial) -> TrialOutcome:
        """Run ``trial`` in a new process and return its outcome."""
        self.count += 1
        name = f"{self.count:02d}"
        request = self.request(trial, name)
        path = self.folder / f"{name}.request.json"
        path.write_text(json.dumps(request, indent=1))
        out, stage, log = Path(request["out"]), Path(request["stage"]), self.folder / f"{name}.log"
        # the child imports what this process can: a pickled model's class, a backend's module
        paths = [p for p in sys.path if p and os.path.isdir(p)]
        env = {
            **os.environ,
            "TORCHINDUCTOR_CACHE_DIR": str(self.folder / f"{name}.inductor"),
            "PYTHONPATH": os.pathsep.join([*paths, os.environ.get("PYTHONPATH", "")]).rstrip(
                os.pathsep
            ),
        }
        start = time.perf_counter()
        with log.open("w") as sink:
            proc = subprocess.Popen(
                [sys.executable, "-m", "torchcompile_kit.doctor.trial", str(path)],
                stdout=sink,
                stderr=subprocess.STDOUT,
                env=env,
            )
            try:
                code = proc.wait(timeout=self.timeout_s)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
                return TrialOutcome(
                    label=trial.label,
                    status="timeout",
                    stage=_read(stage),
                    error=f"no result within {self.timeout_s:.0f} s (--timeout)",
                    seconds=round(time.perf_counter() - start, 3),
                )
        seconds = round(time.perf_counter() - start, 3)
        if code < 0:
            return TrialOutcome(
                label=trial.label,
                status="crashed",
                signal=-code,
                stage=_read(stage),
                error=f"the process died with {_signal_name(-code)}",
                seconds=seconds,
            )
        if code != 0 or not out.is_file():
            return TrialOutcome(
                label=trial.label,
                status="runtime-error",
                stage=_read(stage),
                error=f"the trial's process exited {code}: {_last_line(log)} (log: {log})",
                seconds=seconds,
            )
        outcome = TrialOutcome.from_dict(json.loads(out.read_text()))
        outcome.seconds = seconds
        return outcome


def _read(path: Path) -> str | None:
    return path.read_text().strip() if path.is_file() else None


def _signal_name(number: int) -> str:
    try:
        return f"signal {number} ({signal.Signals(number).name})"
    except ValueError:
        return f"signal {number}"


def _last_line(log: Path) -> str:
    lines = [line for line in log.read_text(errors="replace").splitlines() if line.strip()]
    return lines[-1][:300] if lines else "(no output)"
