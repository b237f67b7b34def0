"""The library's child processes: started, waited for or polled, stopped, and their end read
in one set of words with one rule for their log.

The bench's recipes (a process per rank, progress read from rank 0's pipe), the doctor's repro
check (a script) and the background compile worker (beside training, polled at each step) start
with :func:`start` and end with :func:`wait` or :func:`poll` (past its timeout a child is
stopped: a hang) or :func:`stop`. The doctor's trials are forked by its trial starter (a process
that talks a line protocol on its stdin and stdout) and read their end from its ``waitpid``
status. Every one of them reads its end as a :class:`ChildEnd`, in the words of
:meth:`ChildEnd.describe` with the log's tail (:func:`log_tail`).
"""

from __future__ import annotations

import os
import selectors
import signal
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import IO

__all__ = ["ChildEnd", "log_tail", "poll", "start", "stop", "wait"]

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


def start(
    command: list[str],
    *,
    env: dict[str, str],
    log: IO[bytes] | IO[str],
    pipe: bool = False,
    own_session: bool = False,
) -> subprocess.Popen:
    """Start ``command`` with its output in ``log`` (an open file; with ``pipe``, stdout is a
    text pipe for :func:`wait`'s ``on_line`` and only stderr goes to the log); ``own_session``:
    in a process group of its own, so that :func:`stop` ends what it starts too.

    Example:
        >>> with open("child.log", "w") as log:  # doctest: +SKIP
        ...     child = start([sys.executable, "-c", "print(1)"], env=dict(os.environ), log=log)
        >>> wait(child, timeout_s=60, log=Path("child.log")).ok  # doctest: +SKIP
        True
    """
    return subprocess.Popen(
        command,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE if pipe else log,
        stderr=log if pipe else subprocess.STDOUT,
        text=pipe,
        env=env,
        start_new_session=own_session,
    )


def wait(
    process: subprocess.Popen,
    *,
    timeout_s: float | None,
    log: Path | None,
    on_line: Callable[[str], None] | None = None,
) -> ChildEnd:
    """Wait for ``process`` (passing each line of its stdout pipe to ``on_line``) and read its
    end; past ``timeout_s`` it is stopped and read as a hang."""
    began = time.monotonic()
    deadline = None if timeout_s is None else began + timeout_s
    if process.stdout is not None and not _pump(process.stdout, deadline, on_line):
        stop(process)
        return ChildEnd.timed_out(timeout_s or 0.0, log)
    try:
        code = process.wait(None if deadline is None else max(0.0, deadline - time.monotonic()))
    except subprocess.TimeoutExpired:
        stop(process)
        return ChildEnd.timed_out(timeout_s or 0.0, log)
    return ChildEnd.of(code, log)


def poll(
    process: subprocess.Popen, *, started: float, timeout_s: float, log: Path | None
) -> ChildEnd | None:
    """Without waiting: ``None`` while ``process`` runs within ``timeout_s`` of ``started``
    (``time.perf_counter()``); its end otherwise (past the timeout it is stopped: a hang)."""
    code = process.poll()
    if code is not None:
        return ChildEnd.of(code, log)
    if time.perf_counter() - started > timeout_s:
        stop(process)
        return ChildEnd.timed_out(timeout_s, log)
    return None


def _pump(pipe: IO[str], deadline: float | None, on_line: Callable[[str], None] | None) -> bool:
    """Read ``pipe`` to its end, each line to ``on_line``; ``False`` when the deadline passed."""
    selector = selectors.DefaultSelector()
    selector.register(pipe, selectors.EVENT_READ)
    try:
        while True:
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                return False
            if not selector.select(timeout=left):
                continue
            line = pipe.readline()
            if not line:
                return True
            if on_line is not None:
                on_line(line)
    finally:
        selector.close()
