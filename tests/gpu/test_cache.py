"""The compile cache on CUDA: what the header records of the GPU, and a warm restart through
``compile_cache`` with ``precompile=True`` (no trace, cache hits, Triton kernels restored, the
same losses bit for bit)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import torch

from torchcompile_kit.cache import current_environment

from .conftest import cuda_only
from .restart_worker import failures

REPO = Path(__file__).resolve().parents[2]
WORKER = Path(__file__).with_name("restart_worker.py")


def test_the_header_records_the_current_gpu(device):
    cuda_only(device, "a GPU's identity")
    env = current_environment()
    properties = torch.cuda.get_device_properties(torch.cuda.current_device())
    assert env["device_type"] == "cuda" and env["cuda"] == torch.version.cuda
    assert env["gpu"] == {
        "name": properties.name,
        "capability": [properties.major, properties.minor],
        "sm_count": properties.multi_processor_count,
    }
    assert env["triton"]  # Triton's version: inductor's kernels are Triton's
    print(
        "header on this GPU:", json.dumps({k: env[k] for k in ("gpu", "driver", "cuda", "triton")})
    )


def _restart(mode, artifact, tmp_path, device):
    env = {
        **os.environ,
        "TORCHINDUCTOR_CACHE_DIR": str(tmp_path / f"inductor-{mode}"),
        "TRITON_CACHE_DIR": str(tmp_path / f"triton-{mode}"),
        "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])),
    }
    out = subprocess.run(
        [sys.executable, str(WORKER), mode, str(artifact), str(device), "2"],
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
        check=False,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_a_warm_restart_runs_every_region_precompiled_with_the_same_losses(device, tmp_path):
    artifact = tmp_path / "cc.tck"
    cold = _restart("cold", artifact, tmp_path, device)
    warm = _restart("warm", artifact, tmp_path, device)
    print("restart:", json.dumps({"cold": cold, "warm": warm}))
    # saved, loaded, every region precompiled, dynamo's entries hit, no cache miss, the losses bit
    # for bit; on CUDA, Triton kernels from the artifact and cubins written
    assert failures(cold, warm, device.type) == []
