"""tools/gpu_check.sh, the device check: on a machine where torch sees no CUDA device it stops at
once with its message (its phases are tested end to end with ``--cpu-dry-run``, by hand: minutes
of inductor on a CPU)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

SCRIPT = Path(__file__).resolve().parents[1] / "tools" / "gpu_check.sh"


@pytest.mark.skipif(
    torch.cuda.is_available(), reason="a CUDA device is visible: the check would run"
)
def test_without_a_gpu_the_check_stops_at_once_and_says_why(tmp_path):
    out = subprocess.run(
        ["bash", str(SCRIPT), "--out", str(tmp_path / "check")],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "PYTHON": sys.executable},
        check=False,
    )
    assert out.returncode == 3, out.stderr
    assert "torch sees no CUDA device here" in out.stderr and "--cpu-dry-run" in out.stderr
    assert not (tmp_path / "check" / "check.json").exists()  # no phase ran


def test_a_wrong_argument_is_named(tmp_path):
    out = subprocess.run(
        ["bash", str(SCRIPT), "--gpus", "2"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert out.returncode == 2 and "unknown argument '--gpus'" in out.stderr
