"""The GPU suite (``python -m pytest -m gpu``): the library's CUDA paths on a real CUDA device.

Every test here is marked ``gpu`` and skipped, with the reason, where torch sees no CUDA device.
``TORCHCOMPILE_KIT_GPU_DRY_RUN=1`` runs them on the CPU instead (``tools/gpu_check.sh
--cpu-dry-run``): the tests' own code is checked before anyone spends GPU minutes on it, and the
assertions that only a GPU can make are skipped with their reason.
"""

from __future__ import annotations

import os

import pytest
import torch

DRY_RUN = os.environ.get("TORCHCOMPILE_KIT_GPU_DRY_RUN") == "1"


def pytest_collection_modifyitems(config, items):
    here = os.path.dirname(__file__)
    skip = pytest.mark.skip(
        reason=f"needs a CUDA device: torch {torch.__version__} (CUDA "
        f"{torch.version.cuda}) sees none here"
    )
    for item in items:
        if str(item.fspath).startswith(here):
            item.add_marker(pytest.mark.gpu)
            if not DRY_RUN and not torch.cuda.is_available():
                item.add_marker(skip)


@pytest.fixture
def device() -> torch.device:
    """The GPU (the CPU in a dry run)."""
    return torch.device("cpu") if DRY_RUN else torch.device("cuda")


def cuda_only(device: torch.device, what: str) -> None:
    """Skip the rest of a test in a dry run: ``what`` needs a GPU."""
    if device.type != "cuda":
        pytest.skip(f"dry run on the CPU: {what} needs a CUDA device")
