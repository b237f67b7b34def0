"""The batches a recipe trains on: the captioner's samples padded the recipe's way (``max``,
``longest``, ``multiple_of_32``, ``buckets``; docs/benchmarks.md "Recipes"), or the ``--model``
spec's ``make_batch(step)``. Every recipe sees the same samples in the same order, the bucket
recipe excepted (its sampler groups samples by length).
"""

from __future__ import annotations

import itertools
import os
from collections.abc import Callable, Iterator
from typing import Any

from .captioner import CaptionerPreset, caption_samples
from .model_spec import ModelSpec
from .recipes import Recipe

__all__ = [
    "SEQUENCE_KEYS",
    "batch_stream",
    "planned_tokens_per_step",
    "repad",
    "seq_keys",
    "spec_buckets",
]

SEQUENCE_KEYS = (
    "input_ids",
    "attention_mask",
    "labels",
    "token_type_ids",
    "position_ids",
    "decoder_input_ids",
    "decoder_attention_mask",
)
"""Keys whose dim 1 is the sequence (marked dynamic by ``mark-dynamic``)."""

Prepare = Callable[[Callable[[dict[str, Any]], Any]], None]


def seq_keys(batch: dict[str, Any]) -> list[str]:
    """The keys of ``batch`` whose dim 1 is the sequence length (2-D tensors only)."""
    return [k for k in SEQUENCE_KEYS if k in batch and getattr(batch[k], "ndim", 0) >= 2]


def batch_stream(
    recipe: Recipe, spec: ModelSpec, preset: CaptionerPreset, device: Any
) -> tuple[Iterator[dict[str, Any]], Prepare | None]:
    """``(batches, prepare)`` for ``recipe``: an endless batch iterator, and what compiles every
    shape up front before the first step (buckets), or ``None``."""
    from torchcompile_kit import (
        BucketBatchSampler,
        PadToBucketCollator,
        plan_buckets,
        warmup_shapes,
    )

    if spec.make_batch is not None:
        given = (spec.make_batch(index) for index in itertools.count())
        collate = _spec_collator(recipe, spec, preset)
        if collate is not None:
            return (repad(b, collate) for b in given), None
        return given, None

    size = preset.batch_size
    # enough samples for any step count; 64 batches is a few MB at the tiny preset
    pool = caption_samples(preset, size * 64, seed=0)
    if recipe.data == "buckets":
        lengths = [len(s["labels"]) for s in pool]
        buckets = plan_buckets(
            lengths, max_buckets=preset.max_buckets, max_length=preset.max_length
        )
        sampler = BucketBatchSampler(lengths, buckets, size, drop_last=True, seed=0)
        collate = PadToBucketCollator(buckets=buckets)

        def by_bucket() -> Iterator[dict[str, Any]]:
            for epoch in itertools.count():
                sampler.set_epoch(epoch)
                for indices in sampler:
                    yield collate([pool[i] for i in indices])

        def prepare(forward_backward: Callable[[dict[str, Any]], Any]) -> None:
            warm = [collate([pool[i] for i in idx]) for idx in sampler.warmup_indices()]
            warmup_shapes(forward_backward, warm)

        return by_bucket(), prepare
    if recipe.data == "max":
        collate = PadToBucketCollator(buckets=[preset.max_length])
    elif recipe.data == "longest":
        collate = PadToBucketCollator(multiple_of=8, max_length=preset.max_length)
    else:
        collate = PadToBucketCollator(multiple_of=32, max_length=preset.max_length)

    # DDP: rank r of w takes every w-th batch, so the ranks train on different samples
    rank, world = int(os.environ.get("RANK", "0")), int(os.environ.get("WORLD_SIZE", "1"))

    def in_order() -> Iterator[dict[str, Any]]:
        for index in itertools.count():
            start = ((index * world + rank) * size) % len(pool)
            yield collate(pool[start : start + size])

    return in_order(), None


def _spec_collator(recipe: Recipe, spec: ModelSpec, preset: CaptionerPreset) -> Any:
    """The collator that re-pads a ``--model`` spec's batches for ``recipe``, or ``None``."""
    from torchcompile_kit import PadToBucketCollator

    if recipe.data == "multiple_of_32":
        return PadToBucketCollator(multiple_of=32)
    if recipe.data == "buckets":  # execute checks that the spec gave lengths
        return PadToBucketCollator(buckets=spec_buckets(spec.lengths, preset))
    return None


def spec_buckets(lengths: list[int], preset: CaptionerPreset) -> list[int]:
    """The buckets the ``buckets`` recipe pads a ``--model`` spec's batches to (planned from its
    lengths, at most the preset's ``max_buckets``; each batch padded to the smallest that fits).

    Example:
        >>> from torchcompile_kit.bench import PRESETS
        >>> spec_buckets([5, 6, 7, 30, 31, 200], PRESETS["tiny"])
        [8, 32, 200]
    """
    from torchcompile_kit import plan_buckets

    return plan_buckets(lengths, max_buckets=preset.max_buckets)


def planned_tokens_per_step(
    recipe: Recipe,
    spec: ModelSpec,
    preset: CaptionerPreset,
    device: Any,
    steps: int,
    *,
    samples: int = 2048,
) -> float | None:
    """Mean padded tokens per step over a run of ``steps`` steps of ``recipe``'s batches (``None``
    without a token tensor): what a long run computes per step, to which ``tune`` scales its timed
    steps. A spec's ``make_batch(step)`` is called at ``samples`` steps spread over the run; the
    captioner's stream is read from the start.
    """
    from .metrics import real_and_computed

    count = max(1, min(steps, samples))
    if spec.make_batch is not None:
        indices = sorted({int(i * steps / count) for i in range(count)})
        batches = [spec.make_batch(index) for index in indices]
        collate = _spec_collator(recipe, spec, preset)
        if collate is not None:  # re-padded as the timed run re-pads them
            batches = [repad(b, collate) for b in batches]
    else:
        stream, _ = batch_stream(recipe, spec, preset, device)
        batches = list(itertools.islice(stream, count))
    tokens = [real_and_computed(b)[1] for b in batches]
    tokens = [t for t in tokens if t]
    return sum(tokens) / len(tokens) if tokens else None


def repad(
    batch: dict[str, Any], collate: Callable[[list[dict[str, Any]]], dict[str, Any]]
) -> dict[str, Any]:
    """Re-pad a ``--model`` batch as ``collate`` (a :class:`PadToBucketCollator`) pads: each row cut
    to its attention mask's length (right padding assumed) and the rows collated again."""
    keys = seq_keys(batch)
    if not keys:
        return batch
    mask = next((batch[k] for k in ("attention_mask", "decoder_attention_mask") if k in keys), None)
    features = []
    for i in range(batch[keys[0]].shape[0]):
        length = int(mask[i].sum()) if mask is not None else batch[keys[0]].shape[1]
        features.append(
            {
                k: v[i, :length] if k in keys else v[i]
                for k, v in batch.items()
                if hasattr(v, "shape")
            }
        )
    padded = collate(features)
    return {k: padded[k] for k in batch}  # the collator may add a mask the model does not take
