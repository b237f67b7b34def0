"""Compile-cache fixtures: one real cold compile per session, shared by the tests that need it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

WORKER = Path(__file__).with_name("cache_worker.py")
REPO = Path(__file__).resolve().parents[2]


def run_worker(
    mode: str,
    *args: str,
    inductor_dir: Path,
    timeout: int = 600,
    env: dict[str, str] | None = None,
    may_fail: bool = False,
) -> dict:
    """Run ``cache_worker.py MODE ARGS`` in a fresh process with its own inductor cache dir (and
    ``env`` over this process's environment). ``may_fail``: a worker that dies is a result
    (``{"returncode": ..., "stderr": ...}``), not an assertion."""
    env = {
        **os.environ,
        "TORCHINDUCTOR_CACHE_DIR": str(inductor_dir),
        "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])),
        **(env or {}),
    }
    out = subprocess.run(
        [sys.executable, str(WORKER), mode, *args],
        capture_output=True,
        check=False,
        text=True,
        env=env,
        timeout=timeout,
    )
    if may_fail and out.returncode != 0:
        return {"returncode": out.returncode, "stderr": out.stderr}
    assert out.returncode == 0, f"worker {mode} failed:\n{out.stdout}\n{out.stderr}"
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="session")
def cold_artifact(tmp_path_factory) -> tuple[Path, dict]:
    """A real artifact: a fresh process compiled a tiny MLP train step with inductor and saved."""
    root = tmp_path_factory.mktemp("cold")
    path = root / "cold.tck"
    result = run_worker("cold", str(path), inductor_dir=root / "inductor")
    assert result["saved"], result
    return path, result


@pytest.fixture
def inductor_dir(tmp_path, monkeypatch) -> Path:
    """An empty inductor cache dir for this test (the loads install kernels there).

    A background CPU ISA probe an earlier test's load started writes its probe files into
    whatever ``TORCHINDUCTOR_CACHE_DIR`` says when it gets there (seen on torch 2.15): it is
    waited for first, so this test's directory holds only what this test put there.
    """
    from torchcompile_kit import _dynamo

    assert _dynamo.wait_for_cpu_isa_probe(timeout=300)
    directory = tmp_path / "inductor"
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(directory))
    return directory


FAKE_MEGA = b"mega-cache bytes " * 700


@pytest.fixture
def fake_mega_cache(monkeypatch):
    """Stand in for torch's mega-cache (the storage and format are under test, not inductor)."""
    from torchcompile_kit import _dynamo

    loaded: list[bytes] = []
    monkeypatch.setattr(_dynamo, "save_mega_cache", lambda: (FAKE_MEGA, {"inductor": 3}))

    def load(data: bytes):
        loaded.append(data)
        return {"inductor": 3}

    monkeypatch.setattr(_dynamo, "load_mega_cache", load)
    return loaded
