"""Run a trial in a process of its own: a timeout, a compile of its own (no cached graph), its log
kept, and a process that dies (SIGSEGV, SIGFPE, SIGABRT) turned into an outcome, never a dead
doctor."""

from __future__ import annotations

import json
import os
import select
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from .._child import ChildEnd
from .record import Trial, TrialOutcome

__all__ = ["TrialRunner"]

# Every trial traces, partitions, generates code and autotunes for itself: no graph, autograd
# graph or autotuning result is read from a cache (a cached graph would answer for the trial, and
# "again (is it deterministic?)" would replay the first). Only the kernels' binaries are shared,
# through one inductor cache dir per diagnosis: the C++ compiler's (or Triton's) output for the
# same source and flags, which a fresh compile would rebuild byte for byte. Measured on this
# project's 2-core CPU, the doctor's ReLU patient compiled forward and backward at two shapes in
# 18.5 s from an empty cache dir and in 4.0 s with its kernels' binaries cached (2026-11-29).
# Inductor reads these when it is imported: they are the trial starter's environment (the
# autotuning cache, which has no variable, is turned off there by _dynamo.autotune_afresh).
_COMPILE_AFRESH = {
    "TORCHINDUCTOR_FX_GRAPH_CACHE": "0",
    "TORCHINDUCTOR_AUTOGRAD_CACHE": "0",
    "TORCHINDUCTOR_FX_GRAPH_REMOTE_CACHE": "0",
    "TORCHINDUCTOR_AUTOGRAD_REMOTE_CACHE": "0",
}


class TrialRunner:
    """Starts each trial's process with the same saved weights, batch and seed.

    Args:
        work: the doctor's output folder (requests, outcomes and logs go under ``trials/``).
        inputs: what every request carries (``spec`` or ``model``, ``state``, ``batch``, ``seed``).
        timeout_s: seconds a trial may run before it is killed (``timeout``).

    Example:
        >>> runner = TrialRunner(Path("out"), {"spec": "m:build", ...},  # doctest: +SKIP
        ...     timeout_s=600)
        >>> runner.run(Trial(label="triage")).status  # doctest: +SKIP
        'ok'
    """

    def __init__(self, work: Path, inputs: dict[str, Any], *, timeout_s: float) -> None:
        self.folder = work / "trials"
        self.folder.mkdir(parents=True, exist_ok=True)
        self.inputs = inputs
        self.timeout_s = timeout_s
        self.count = 0
        self._zygote: _Zygote | None = None

    def close(self) -> None:
        """End the process that starts the trials."""
        if self._zygote is not None:
            self._zygote.close()
            self._zygote = None

    def _starter(self) -> _Zygote:
        if self._zygote is None:
            self._zygote = _Zygote(self.folder / "zygote.log")
        return self._zygote

    def request(self, trial: Trial, name: str) -> dict[str, Any]:
        """The request the trial's process reads (also what a repro script replays)."""
        return {
            **self.inputs,
            "trial": trial.as_dict(),
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
        env = {"TORCHINDUCTOR_CACHE_DIR": str(self.folder / "inductor")}
        start = time.perf_counter()
        code = self._starter().run(path, log, env, timeout_s=self.timeout_s)
        seconds = round(time.perf_counter() - start, 3)
        if code is not None and code > 0 and not stage.is_file():  # it never began
            raise RuntimeError(
                f"the doctor's trial process failed before running anything: "
                f"{ChildEnd.of(code, log).describe()} (log: {log})"
            )
        if code is None or code != 0 or not out.is_file():
            end = (
                ChildEnd.timed_out(self.timeout_s, log) if code is None else ChildEnd.of(code, log)
            )
            status = "timeout" if code is None else "crashed" if end.signal else "runtime-error"
            return TrialOutcome(
                **trial.names(),
                status=status,
                signal=end.signal,
                stage=_read(stage),
                error=f"{end.describe()}{'' if code else ', without an outcome'} (log: {log})",
                seconds=seconds,
            )
        outcome = TrialOutcome.from_dict(json.loads(out.read_text()))
        outcome.seconds = seconds
        return outcome


class _Zygote:
    """The process that forks each trial (:mod:`.zygote`), started with what the trials import
    (this process's ``sys.path``: a pickled model's class, a backend's module)."""

    def __init__(self, log: Path) -> None:
        paths = [p for p in sys.path if p and os.path.isdir(p)]
        env = {
            **os.environ,
            **_COMPILE_AFRESH,
            "PYTHONPATH": os.pathsep.join([*paths, os.environ.get("PYTHONPATH", "")]).rstrip(
                os.pathsep
            ),
        }
        self.log = log
        self._buffer = b""
        with log.open("w") as sink:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "torchcompile_kit.doctor.zygote"],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=sink,
                env=env,
            )
        self._answer(None)  # {"ready": true}

    def run(self, request: Path, log: Path, env: dict[str, str], *, timeout_s: float) -> int | None:
        """Start the trial of ``request`` and wait: its exit code (negative: the signal that
        killed it), or ``None`` when it ran past ``timeout_s`` (then it is killed)."""
        assert self.process.stdin is not None
        ask = {"request": str(request), "log": str(log), "env": env}
        self.process.stdin.write((json.dumps(ask) + "\n").encode())
        self.process.stdin.flush()
        pid = self._answer(None)["pid"]
        ended = self._answer(timeout_s)
        if ended is None:
            os.kill(pid, signal.SIGKILL)
            self._answer(None)
            return None
        return os.waitstatus_to_exitcode(ended["status"])

    def _answer(self, timeout_s: float | None) -> Any:
        """The zygote's next line, read from its pipe as it comes (``None``: no line within
        ``timeout_s``)."""
        assert self.process.stdout is not None
        pipe = self.process.stdout.fileno()
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        while b"\n" not in self._buffer:
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            if not select.select([pipe], [], [], left)[0]:
                return None
            chunk = os.read(pipe, 65536)
            if not chunk:
                raise RuntimeError(
                    "the doctor's trial starter ended: "
                    f"{ChildEnd.of(self.process.wait(), self.log).describe()} (log: {self.log})"
                )
            self._buffer += chunk
        line, _, self._buffer = self._buffer.partition(b"\n")
        return json.loads(line)

    def close(self) -> None:
        if self.process.stdin is not None:
            self.process.stdin.close()
        try:
            self.process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()


def _read(path: Path) -> str | None:
    return path.read_text().strip() if path.is_file() else None
