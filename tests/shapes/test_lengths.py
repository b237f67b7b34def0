"""Lengths as users have them: lists, tuples, numpy, torch, pandas and HF datasets columns."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
import torch
from datasets import Dataset

from torchcompile_kit import BucketBatchSampler, plan_buckets
from torchcompile_kit.errors import BatchShapeError
from torchcompile_kit.shapes import estimate_padding

LENGTHS = [5, 6, 30, 31, 7, 29, 12, 16, 3, 64]


def _forms():
    """The same lengths in every container a user's data pipeline hands over."""
    ds = Dataset.from_dict({"n": LENGTHS})
    return {
        "list": list(LENGTHS),
        "tuple": tuple(LENGTHS),
        "numpy int64": np.array(LENGTHS, dtype=np.int64),
        "numpy int32": np.array(LENGTHS, dtype=np.int32),
        "list of numpy ints": [np.int64(n) for n in LENGTHS],
        "torch": torch.tensor(LENGTHS),
        "list of 0-d tensors": list(torch.tensor(LENGTHS)),
        "pandas": pd.Series(LENGTHS),
        "pandas float (after dropna)": pd.Series([*LENGTHS, None]).dropna(),
        "datasets column": ds["n"],
        "generator": (n for n in LENGTHS),
    }


@pytest.mark.parametrize("form", list(_forms()))
def test_every_form_plans_and_samples_like_a_list(form):
    lengths = _forms()[form]
    buckets = plan_buckets(lengths, max_buckets=3, multiple_of=8)
    assert buckets == plan_buckets(LENGTHS, max_buckets=3, multiple_of=8)
    assert all(type(b) is int for b in buckets)
    assert estimate_padding(_forms()[form], buckets) == estimate_padding(LENGTHS, buckets)
    sampler = BucketBatchSampler(_forms()[form], buckets, batch_size=3, num_replicas=1, rank=0)
    assert sorted(i for batch in sampler for i in batch) == list(range(len(LENGTHS)))


def test_buckets_may_be_numpy_too():
    buckets = np.array([8, 32, 64])
    sampler = BucketBatchSampler(LENGTHS, buckets, batch_size=2, num_replicas=1, rank=0)
    assert sampler.buckets == [8, 32, 64] and all(type(b) is int for b in sampler.buckets)


@pytest.mark.parametrize(
    ("lengths", "match"),
    [
        ([], "empty"),
        ([4, 0, 5], r"lengths\[1\] is 0.*drop empty samples"),
        ([4, -2], r"lengths\[1\] is -2; every length must be at least 1$"),
        (pd.Series([4.0, float("nan")]), r"lengths\[1\] is nan.*whole number of tokens"),
        (np.array([4.5, 3.0]), r"lengths\[0\] is 4.5.*whole number"),
        (["4", "5"], r"lengths\[0\] is '4' \(str\).*must be an int"),
        ([True, 3], r"lengths\[0\] is True, a bool"),
        (np.ones((2, 3), dtype=int), r"1-D.*shape \(2, 3\).*mask.sum\(dim=1\)"),
        (12, r"one token length per sample.*got int 12"),
        ("12", r"one token length per sample.*got str"),
    ],
)
def test_real_errors_are_refused_with_a_hint_that_fits(lengths, match):
    with pytest.raises(BatchShapeError, match=match):
        plan_buckets(lengths)
