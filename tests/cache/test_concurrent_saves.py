"""Two jobs, one cache path: a save killed mid-write leaves nothing behind the next save does not
sweep, and of two savers the one whose artifact does not survive is told (docs/cache.md, "One
path, one job"). The other job is a real process; torch's mega-cache is faked (storage is under
test, not inductor)."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import warnings
from pathlib import Path

import pytest

from torchcompile_kit import load_compile_cache, save_compile_cache
from torchcompile_kit.cache import CompileCacheWarning, storage

# another job's save, which stops after its first chunk until its stdin closes (or is killed there)
SLOW_WRITER = """
import importlib.util, sys

# storage.py imports nothing of the package (nor torch): loaded alone, the writer starts at once
spec = importlib.util.spec_from_file_location("storage", sys.argv[2])
storage = importlib.util.module_from_spec(spec)
spec.loader.exec_module(storage)

chunks = []
def write_chunk(handle, chunk):
    handle.write(chunk)
    handle.flush()
    chunks.append(len(chunk))
    if len(chunks) == 1:
        print("writing", flush=True)
        sys.stdin.read()

storage._write_chunk = write_chunk
storage.write_bytes(sys.argv[1], b"theirs" * (1 << 19))
print("saved", flush=True)
"""


def _start_writer(path: Path) -> subprocess.Popen:
    writer = subprocess.Popen(
        [sys.executable, "-c", SLOW_WRITER, str(path), storage.__file__],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert writer.stdout.readline().strip() == "writing"
    return writer


def _temporaries(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir() if p.name.endswith(".tmp"))


def test_a_save_killed_mid_write_leaves_a_temporary_that_the_next_save_removes(
    tmp_path, inductor_dir, fake_mega_cache
):
    path = tmp_path / "cc.tck"
    writer = _start_writer(path)
    writer.send_signal(signal.SIGKILL)
    writer.wait(timeout=60)
    assert len(_temporaries(tmp_path)) == 1 and not path.exists()  # what kill -9 leaves
    result = save_compile_cache(path)
    assert result.saved, result.reason
    assert _temporaries(tmp_path) == []
    assert load_compile_cache(path).loaded


def test_only_leftovers_of_this_path_are_swept(tmp_path, inductor_dir, fake_mega_cache):
    """Removed: this path's temporaries whose writer on this host is gone, and any older than an
    hour. Kept: a live writer's, a young one that cannot be checked, another file's."""
    host = socket.gethostname().replace(".", "_")
    dead = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    names = {
        "dead writer": f".cc.tck.{host}.{dead}.a1.tmp",
        "old, unnamed": ".cc.tck.b2.tmp",
        "live writer": f".cc.tck.{host}.{os.getpid()}.c3.tmp",
        "young, unnamed": ".cc.tck.d4.tmp",
        "another file's": f".other.tck.{host}.{dead}.e5.tmp",
    }
    for name in names.values():
        (tmp_path / name).write_bytes(b"x")
    hours_ago = (tmp_path / names["old, unnamed"]).stat().st_mtime - 2 * 3600
    os.utime(tmp_path / names["old, unnamed"], (hours_ago, hours_ago))
    assert save_compile_cache(tmp_path / "cc.tck").saved
    assert _temporaries(tmp_path) == sorted(
        names[k] for k in ("live writer", "young, unnamed", "another file's")
    )


def test_a_save_while_another_process_saves_to_the_same_path_is_refused_and_says_so(
    tmp_path, inductor_dir, fake_mega_cache
):
    path = tmp_path / "cc.tck"
    writer = _start_writer(path)
    try:
        with pytest.warns(CompileCacheWarning, match="another process is saving to .* right now"):
            result = save_compile_cache(path)
    finally:
        writer.stdin.close()
        assert writer.stdout.readline().strip() == "saved" and writer.wait(timeout=60) == 0
    assert not result.saved and "another job's artifact is kept" in result.reason
    assert path.read_bytes() == b"theirs" * (1 << 19)  # the survivor is whole


def test_a_save_over_an_artifact_another_job_wrote_since_this_one_started_is_refused(
    tmp_path, inductor_dir, fake_mega_cache
):
    """The two jobs' saves do not overlap in time: the second would still discard the first's
    compiled code without a word. It is refused, unless this process read that artifact first."""
    path = tmp_path / "cc.tck"
    writer = _start_writer(path)
    writer.stdin.close()
    assert writer.wait(timeout=60) == 0
    with pytest.warns(
        CompileCacheWarning, match="saved at .* by another process .*, after this one started"
    ):
        result = save_compile_cache(path)
    assert not result.saved
    assert path.read_bytes() == b"theirs" * (1 << 19)
    with warnings.catch_warnings():
        warnings.simplefilter(
            "ignore", CompileCacheWarning
        )  # it is not an artifact: refused to load
        load_compile_cache(path)
    assert save_compile_cache(path).saved  # read, judged: replaced as a save should


def test_an_earlier_jobs_artifact_or_a_copied_file_is_replaced(
    tmp_path, monkeypatch, inductor_dir, fake_mega_cache
):
    earlier = tmp_path / "earlier" / "cc.tck"
    writer = _start_writer(earlier)
    writer.stdin.close()
    assert writer.wait(timeout=60) == 0
    started = storage._STARTED
    monkeypatch.setattr(
        storage, "_STARTED", earlier.stat().st_mtime + 1
    )  # this job started after it
    assert save_compile_cache(earlier).saved
    monkeypatch.setattr(storage, "_STARTED", started)
    copied = tmp_path / "copied.tck"
    copied.write_bytes(b"downloaded by this job, not saved by another")
    assert save_compile_cache(copied).saved
    assert load_compile_cache(earlier).loaded and load_compile_cache(copied).loaded
