"""Benchmark recipe ``shapes``: padding, distinct shapes and recompiles per padding scheme.

On the seed's length mix (90% in [5,31], 9% in [33,63], 1% in [65,255]; batch 64; max 256), one
epoch per scheme through a real ``DataLoader`` with the scheme's sampler and collator. Padding is
counted from the collated ``attention_mask`` (pad tokens / computed tokens). Recompiles are
counted for real: a tiny embedding+linear LM is compiled with the ``eager`` backend (cheap; the
guards, hence the recompiles, are dynamo's and do not depend on the backend), every expected shape
is compiled by :func:`~torchcompile_kit.warmup_shapes`, then the epoch runs and every frame dynamo
compiles after warm-up is a recompile.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from .. import _dynamo
from .._checks import check_choice
from ..shapes import (
    BucketBatchSampler,
    PadToBucketCollator,
    mark_dynamic_batch,
    plan_buckets,
    warmup_shapes,
)
from .captioner import seed_length_mix  # the seed's caption-length mix, shared with `bench`
from .timing import BenchResult, fresh_compile_state

__all__ = ["run", "seed_length_mix"]

BATCH_SIZE = 64
MAX_LENGTH = 256
VOCAB = 128
_SIZES = {"small": 30, "full": 300}  # batches per epoch


class _TinyLM(torch.nn.Module):
    """Embedding + linear head + masked cross-entropy: every batch tensor shapes the graph."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = torch.nn.Embedding(VOCAB, 16)
        self.head = torch.nn.Linear(16, VOCAB)

    def forward(self, input_ids, attention_mask, labels):
        hidden = self.embed(input_ids) * attention_mask.unsqueeze(-1)
        logits = self.head(hidden)
        return torch.nn.functional.cross_entropy(logits.flatten(0, 1), labels.flatten())


@dataclass(kw_only=True, slots=True)
class _Scheme:
    name: str
    """Row label."""
    collate: PadToBucketCollator
    """The collator (decides the padded length)."""
    batch_sampler: Any
    """Random batches (``BatchSampler``) or a ``BucketBatchSampler``."""
    warmup: Callable[[list[dict[str, list[int]]]], list[dict[str, torch.Tensor]]]
    """Dataset -> the batches warm-up compiles (one per expected shape)."""
    buckets: str = ""
    """Boundaries, as printed."""
    dynamic: bool | None = False
    """``torch.compile(dynamic=...)``: False = one static graph per shape."""
    mark_dynamic: bool = False
    """Mark the sequence dim of the warm-up batch dynamic (mark_dynamic_batch)."""


def _synthetic(collate: PadToBucketCollator, lengths: list[int]) -> list[dict[str, torch.Tensor]]:
    """One batch of ``BATCH_SIZE`` samples of each length (warm-up for random batches)."""
    return [collate([{"input_ids": [3] * n, "labels": [3] * n}] * BATCH_SIZE) for n in lengths]


def _schemes(lengths: list[int], seed: int) -> list[_Scheme]:
    def random_batches() -> torch.utils.data.BatchSampler:
        generator = torch.Generator().manual_seed(seed)
        sampler = torch.utils.data.RandomSampler(range(len(lengths)), generator=generator)
        return torch.utils.data.BatchSampler(sampler, BATCH_SIZE, drop_last=True)

    def grouped(buckets: list[int], name: str) -> _Scheme:
        sampler = BucketBatchSampler(lengths, buckets, BATCH_SIZE, drop_last=True, seed=seed)
        collate = PadToBucketCollator(buckets=buckets)
        return _Scheme(
            name=name,
            collate=collate,
            batch_sampler=sampler,
            warmup=lambda ds: [collate([ds[i] for i in idx]) for idx in sampler.warmup_indices()],
            buckets=str(buckets),
        )

    def random_scheme(
        name: str, collate: PadToBucketCollator, buckets: str, warmup, **kw
    ) -> _Scheme:
        return _Scheme(
            name=f"{name}, random batches",
            collate=collate,
            batch_sampler=random_batches(),
            buckets=buckets,
            warmup=warmup,
            **kw,
        )

    to_max = PadToBucketCollator(buckets=[MAX_LENGTH])
    by_32 = PadToBucketCollator(multiple_of=32, max_length=MAX_LENGTH)
    longest = PadToBucketCollator(multiple_of=1)
    every_32 = list(range(32, MAX_LENGTH + 1, 32))

    def first_batch(ds):  # unbounded shapes: only the first batch can be warmed up
        return [longest([ds[i] for i in next(iter(random_batches()))])]

    return [
        random_scheme("pad-to-max", to_max, "[256]", lambda ds: _synthetic(to_max, [MAX_LENGTH])),
        random_scheme(
            "multiple-of-32", by_32, "32, 64, ..., 256", lambda ds: _synthetic(by_32, every_32)
        ),
        random_scheme("pad-to-longest, dynamic=False", longest, "unbounded", first_batch),
        random_scheme(
            "pad-to-longest, automatic dynamic", longest, "unbounded", first_batch, dynamic=None
        ),
        random_scheme(
            "pad-to-longest + mark_dynamic_batch",
            longest,
            "unbounded",
            first_batch,
            dynamic=None,
            mark_dynamic=True,
        ),
        grouped(every_32, "multiple-of-32 + BucketBatchSampler"),
        grouped(
            plan_buckets(lengths, max_buckets=4, max_length=MAX_LENGTH),
            "plan_buckets K=4 + BucketBatchSampler",
        ),
        grouped(
            plan_buckets(lengths, max_buckets=8, max_length=MAX_LENGTH),
            "plan_buckets K=8 + BucketBatchSampler",
        ),
        grouped(
            plan_buckets(lengths, max_buckets=8, multiple_of=1, max_length=MAX_LENGTH),
            "plan_buckets K=8 multiple_of=1 + sampler",
        ),
    ]


def _measure(scheme: _Scheme, dataset: list[dict[str, list[int]]]) -> dict[str, Any]:
    with fresh_compile_state(), torch.no_grad():
        counter = _dynamo.frame_counting_backend()
        model = torch.compile(_TinyLM(), backend=counter, dynamic=scheme.dynamic)
        step = lambda batch: model(**batch)
        warm = scheme.warmup(dataset)
        if scheme.mark_dynamic:
            mark_dynamic_batch(warm[0], 1)
        limit_hits = _dynamo.recompile_limit_hits()
        warmup_shapes(step, warm)
        warm_frames = counter.frame_count
        loader = torch.utils.data.DataLoader(
            dataset, batch_sampler=scheme.batch_sampler, collate_fn=scheme.collate
        )
        shapes, real, computed = set(), 0, 0
        for batch in loader:
            step(batch)
            shapes.add(tuple(batch["input_ids"].shape))
            real += int(batch["attention_mask"].sum())
            computed += batch["attention_mask"].numel()
        eager = _dynamo.recompile_limit_hits() > limit_hits
    return {
        "scheme": scheme.name,
        "buckets": scheme.buckets,
        "padding": f"{100 * (1 - real / computed):.1f}%",
        "tokens x": round(computed / real, 2),
        "shapes": len(shapes),
        "graphs": counter.frame_count,
        "recompiles": counter.frame_count - warm_frames,
        "eager fallback": "yes (recompile_limit hit)" if eager else "no",
        "_padding": 1 - real / computed,
    }


def run(*, size: str) -> BenchResult:
    """Padding, distinct shapes and recompiles after warm-up, per padding scheme.

    Args:
        size: ``"small"`` (30 batches of 64: seconds) or ``"full"`` (300 batches of 64).

    Returns:
        One row per scheme.

    Raises:
        ValueError: ``size`` is neither ``"small"`` nor ``"full"``.

    Example:
        >>> result = run(size="small")  # doctest: +SKIP
    """
    check_choice("size", size, sorted(_SIZES), hint="size must be 'small' or 'full'")
    seed = 0
    lengths = seed_length_mix(_SIZES[size] * BATCH_SIZE, seed=seed)
    rng = random.Random(seed + 1)
    dataset = []
    for n in lengths:
        ids = [rng.randrange(3, VOCAB) for _ in range(n)]
        dataset.append({"input_ids": ids, "labels": ids})
    rows = [_measure(scheme, dataset) for scheme in _schemes(lengths, seed)]
    summary = []
    for row in rows:
        padding = row.pop("_padding")
        if "plan_buckets K=8" in row["scheme"]:
            met = padding <= 0.15 and row["shapes"] <= 8 and row["recompiles"] == 0
            summary.append(
                f"target <=15% padding at <=8 shapes, 0 recompiles — {row['scheme']}: "
                f"{'met' if met else 'missed'} ({row['padding']}, {row['shapes']} shapes, "
                f"{row['recompiles']} recompiles)"
            )
    summary.append(
        "all schemes: drop_last=True (a partial last batch is one more shape); recompiles = "
        "frames compiled after warmup_shapes; tiny LM, backend='eager', forward only"
    )
    return BenchResult(
        recipe="shapes",
        title=f"seed length mix, batch {BATCH_SIZE}, max {MAX_LENGTH}, "
        f"{len(lengths)} samples, one epoch",
        columns=[
            "scheme",
            "buckets",
            "padding",
            "tokens x",
            "shapes",
            "graphs",
            "recompiles",
            "eager fallback",
        ],
        rows=rows,
        summary=summary,
        config={
            "size": size,
            "samples": len(lengths),
            "batch_size": BATCH_SIZE,
            "max_length": MAX_LENGTH,
            "seed": seed,
            "backend": "eager",
        },
    )
