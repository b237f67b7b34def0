"""How a child process of the library ended, in one set of words, with one rule for its log.

Four parts of the library start processes, each its own way: the bench's recipes (a process per
rank, their progress read from a pipe), the doctor's trials (forked by its trial starter), the
doctor's repro check (a script) and the background compile worker (beside training, polled).
They read the end alike: :class:`ChildEnd` from an exit status, a signal or a timeout, and its
words (:meth:`ChildEnd.describe`) with the log's tail (:func:`log_tail`).
"""

from __future__ import annotations

import os
import signal
import subprocess
from dataclasses import dataclass
from pathlib import Path

__all__ = ["ChildEnd", "log_tail", "stop"]

_TAIL_CHARS = 800


@dataclass(frozen=True, slots=True)
class ChildEnd:
    """How a child process ended."""

    code: int | None = None
    """Its exit code; ``None`` when a signal killed it or it was stopped at its timeout."""
    signal: int | None = None
    """The signal that killed it, when that was not the timeout's."""
    hung_s: float | None = None
    """It had not ended after this many seconds (its timeout) and was stopped: a hang."""
    tail: str = ""
    """What its log ends with (:func:`log_tail`)."""

    @classmethod
    def of(cls, returncode: int, log: Path | None = None) -> ChildEnd:
        """From ``Popen.returncode`` or ``os.waitstatus_to_exitcode`` (negative: the signal)."""
        tail = log_tail(log) if log is not None and returncode != 0 else ""
        if returncode < 0:
            return cls(signal=-returncode, tail=tail)
        return cls(code=returncode, tail=tail)

    @classmethod
    def timed_out(cls, seconds: float, log: Path | None = None) -> ChildEnd:
        """Stopped after ``seconds`` without ending."""
        return cls(hung_s=seconds, tail=log_tail(log) if log is not None else "")

    @property
    def ok(self) -> bool:
        """It exited 0."""
        return self.code == 0

    def describe(self) -> str:
        """The end in words, the same for every kind of child.

        Example:
            >>> ChildEnd(signal=9).describe()
            'the process died with signal 9 (SIGKILL)'
            >>> ChildEnd(hung_s=600).describe()
            'the process had not ended after 600 s (a hang?) and was stopped'
        """
        if self.hung_s is not None:
            said = f"the process had not ended after {self.hung_s:g} s (a hang?) and was stopped"
        elif self.signal is not None:
            said = f"the process died with {signal_name(self.signal)}"
        else:
            said = f"the process exited {self.code}"
        return f"{said}: {self.tail}" if self.tail else said


def signal_name(number: int) -> str:
    """``signal 9 (SIGKILL)``."""
    try:
        return f"signal {number} ({signal.Signals(number).name})"
    except ValueError:
        return f"signal {number}"


def log_tail(path: Path | None) -> str:
    """What a log ends with, in one line: from its last unindented line (a traceback's exception
    line) to the end, at most 800 characters; ``""`` for an empty or missing log.

    Example:
        >>> import tempfile
        >>> log = Path(tempfile.mkdtemp()) / "x.log"
        >>> _ = log.write_text("Traceback (most recent call last):\\n  File m.py\\nValueError: no")
        >>> log_tail(log)
        'ValueError: no'
    """
    if path is None:
        return ""
    try:
        lines = [line for line in path.read_text(errors="replace").splitlines() if line.strip()]
    except OSError:
        return ""
    if not lines:
        return ""
    unindented = [i for i, line in enumerate(lines) if line[:1] not in (" ", "\t")]
    last = unindented[-1] if unindented else max(len(lines) - 3, 0)
    text = " | ".join(line.strip() for line in lines[last:])
    return text if len(text) <= _TAIL_CHARS else text[:_TAIL_CHARS] + " ..."


def stop(process: subprocess.Popen) -> None:
    """Kill ``process`` (and its process group when it leads one: a compile's own workers go
    with it) and reap it."""
    if process.poll() is not None:
        return
    try:
        if os.getpgid(process.pid) == process.pid:
            os.killpg(process.pid, signal.SIGKILL)
        else:
            process.kill()
    except ProcessLookupError:
        pass
    process.wait()
