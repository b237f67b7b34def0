"""The doctor's trial starter: one process per diagnosis that imports torch, dynamo and inductor
once, then forks a fresh process for each trial (``python -m torchcompile_kit.doctor.zygote``).

Importing them takes about 9 s on a 2-core CPU, a third to a half of a small model's trial; a fork
of a process that has only imported them (as a ``DataLoader`` worker is forked) starts in
milliseconds. Each trial is still a process of its own: it compiles afresh (no cached graph or
autotuning result; only the kernels' binaries of the diagnosis's inductor cache dir, the
environment it is given), its own log, and its death by a signal is reported, not shared.

Protocol, one JSON line each way: the doctor writes ``{"request", "log", "env"}``; this process
answers ``{"pid"}`` once the trial's process runs and ``{"pid", "status"}`` (``os.waitpid``'s
status) when it ends.
"""

from __future__ import annotations

import json
import os
import sys
import traceback

__all__ = ["main"]


def _preload() -> None:
    """What every trial imports: torch, dynamo, inductor's compiler and code generation, and
    the doctor's trial (comparator, monitor, the bench's model loader)."""
    from .. import _dynamo
    from . import trial  # noqa: F401

    _dynamo.preload_compiler()
    _dynamo.autotune_afresh()


def _child(request: str, log: str, env: dict[str, str]) -> None:
    """In the forked process: the log as stdout and stderr, the trial's environment, the trial;
    never returns."""
    code = 1
    try:
        sink = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        os.dup2(sink, 1)
        os.dup2(sink, 2)
        os.close(sink)
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        os.close(null)
        os.environ.update(env)
        from .trial import main as run_trial_file

        code = run_trial_file([request])
    except SystemExit as stop:
        code = stop.code if isinstance(stop.code, int) else 1
    except BaseException:  # noqa: BLE001 - reported in the trial's log, as a plain process would
        traceback.print_exc()
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)


def main() -> int:
    """Preload, say ``{"ready": true}``, then fork one trial per request line until stdin ends."""
    _preload()
    reply = sys.stdout
    print(json.dumps({"ready": True}), file=reply, flush=True)
    for line in sys.stdin:
        if not line.strip():
            continue
        ask = json.loads(line)
        pid = os.fork()
        if pid == 0:
            _child(ask["request"], ask["log"], ask["env"])
        print(json.dumps({"pid": pid}), file=reply, flush=True)
        _, status = os.waitpid(pid, 0)
        print(json.dumps({"pid": pid, "status": status}), file=reply, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
