"""The environment header: what it records and how a difference is named."""

from __future__ import annotations

import torch

from torchcompile_kit.cache.header import (
    FORMAT_VERSION,
    HeaderMismatch,
    compare_environment,
    current_environment,
)


def test_header_records_what_kernels_depend_on():
    env = current_environment()
    assert env["format_version"] == FORMAT_VERSION
    assert env["torch"] == torch.__version__
    assert env["num_threads"] == torch.get_num_threads()
    assert env["cpu_isa"] == torch.backends.cpu.get_cpu_capability()
    for name in (
        "torch_git",
        "python",
        "machine",
        "device_type",
        "cuda",
        "hip",
        "gpu",
        "driver",
        "triton",
        "aten_cpu_capability",
    ):
        assert name in env


def test_identical_environments_match():
    env = current_environment()
    assert compare_environment(env, env) == []
    assert compare_environment({**env, "python": env["python"]}, env) == []


def test_every_differing_field_is_named_with_both_values():
    env = current_environment()
    # an ISA that differs from this machine's by construction (AVX2 and AVX-512 machines alike)
    saved = {**env, "num_threads": env["num_threads"] + 5, "cpu_isa": f"not-{env['cpu_isa']}"}
    saved.pop("triton")
    saved["from_the_future"] = 1
    mismatches = compare_environment(saved, env)
    names = [m.field for m in mismatches]
    assert "num_threads" in names and "cpu_isa" in names and "from_the_future" in names
    assert ("triton" in names) == (env["triton"] is not None)
    threads = next(m for m in mismatches if m.field == "num_threads")
    assert str(threads) == (
        f"num_threads: saved {env['num_threads'] + 5!r}, this process {env['num_threads']!r}"
    )
    assert isinstance(threads, HeaderMismatch)


def _saved_on_a_gpu(env, **fields):
    gpu = {"name": "NVIDIA H100 80GB HBM3", "capability": [9, 0], "sm_count": 132}
    return {
        **env,
        "device_type": "cuda",
        "cuda": "13.0",
        "gpu": gpu,
        "driver": "580.159.04",
        **fields,
    }


def test_a_gpu_artifact_without_cpu_kernels_loads_under_a_launchers_single_thread():
    """torchrun sets OMP_NUM_THREADS=1 for several processes per node: a GPU job's artifact saved
    by a single-process run was refused there (and on the CPU's ISA), though it holds no CPU
    kernel that either could change."""
    import json
    import os
    import subprocess
    import sys

    code = (
        "import json; from torchcompile_kit.cache.header import current_environment as c; "
        "print(json.dumps(c()))"
    )
    launched = json.loads(
        subprocess.run(
            [sys.executable, "-c", code],
            capture_output=True,
            text=True,
            check=True,
            env={**os.environ, "OMP_NUM_THREADS": "1"},
        ).stdout
    )
    assert launched["num_threads"] == 1
    other_isa = "AVX2" if launched["cpu_isa"] != "AVX2" else "AVX512"  # not this machine's
    saved = _saved_on_a_gpu(launched, num_threads=16, cpu_isa=other_isa, driver="570.1")
    loading = _saved_on_a_gpu(launched)
    assert (
        compare_environment(saved, loading, cpu_kernels=False) == []
    )  # the driver is recorded only
    refused = {m.field for m in compare_environment(saved, loading, cpu_kernels=True)}
    assert refused == {"num_threads", "cpu_isa"}  # CPU kernels: built for those


def test_the_gpus_identity_is_compared_and_only_the_current_device():
    env = current_environment()
    saved = _saved_on_a_gpu(env)
    other = {
        **saved["gpu"],
        "sm_count": 114,
    }  # an H100 PCIe, or a MIG slice: other kernels' metadata
    assert [
        m.field for m in compare_environment(saved, {**saved, "gpu": other}, cpu_kernels=False)
    ] == ["gpu"]
    cpu_saved = {
        **env,
        "num_threads": 99,
    }  # saved where no GPU was visible: CPU fields always count
    assert [m.field for m in compare_environment(cpu_saved, env, cpu_kernels=False)] == [
        "num_threads"
    ]
