"""Shared test setup: dynamo is reset around every test; tiny models live in tiny_models.py."""

from __future__ import annotations

import os

import pytest
import torch

# The bench and tune choose CUDA when a GPU is visible: this suite is the CPU suite, on any machine
# (tests/gpu is the GPU suite, and calls the library on CUDA tensors itself).
os.environ.setdefault("TORCHCOMPILE_KIT_BENCH_DEVICE", "cpu")


@pytest.fixture(autouse=True)
def _fresh_dynamo():
    """Each test starts and ends with empty dynamo caches and counters."""
    torch._dynamo.reset()
    torch.manual_seed(0)
    yield
    torch._dynamo.reset()


@pytest.fixture(autouse=True)
def _restore_environment():
    """Each test ends with the environment it started with.

    Libraries leak variables: peft's BOFT layer tries to build a CUDA extension inside an
    environment patch that is not restored when the build fails (no CUDA here), leaving
    ``CC=CXX=gcc``, and inductor then links its C++ kernels with ``gcc`` (no libstdc++) in every
    later process: "undefined symbol ... basic_ostringstream" (see docs/peft.md).
    """
    before = dict(os.environ)
    yield
    if dict(os.environ) != before:
        os.environ.clear()
        os.environ.update(before)
