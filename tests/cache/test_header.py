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
        "gpu_names",
        "triton",
        "aten_cpu_capability",
    ):
        assert name in env


def test_identical_environments_match():
    env = current_environment()
    assert compare_environment(env, env) == []
    assert compare_environment({**env, "gpu_names": tuple(env["gpu_names"])}, env) == []


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
