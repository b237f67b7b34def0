"""Shared test setup: dynamo is reset around every test; tiny models live in tiny_models.py."""

from __future__ import annotations

import pytest
import torch


@pytest.fixture(autouse=True)
def _fresh_dynamo():
    """Each test starts and ends with empty dynamo caches and counters."""
    torch._dynamo.reset()
    torch.manual_seed(0)
    yield
    torch._dynamo.reset()
