"""The batches a recipe trains on: the captioner's samples padded the recipe's way, or the
``--model`` spec's ``make_batch(step)``.

Every recipe of a run sees the same samples in the same order (the bucket recipe excepted: its
sampler groups samples by length), so losses can be compared step by step with eager. Padding
schemes (the post's and the library's):

- ``max``: every caption padded to the max length (the post's static-shape experiments);
- ``longest``: to the batch's longest caption, rounded up to a multiple of 8 (the post rounds to 8
  so SDPA's alignment guard does not recompile);
- ``multiple_of_32``: to a multiple of 32, at most ``max_length / 32`` static graphs;
- ``buckets``: :func:`plan_buckets` over the dataset's lengths, :class:`BucketBatchSampler`
  (every batch from one bucket) and :class:`PadToBucketCollator`; every bucket shape is compiled
  up front with :func:`warmup_shapes` (inside the warm-up timing).
"""

from __future__ import annotations

import itertools
import os
from collections.abc import Callable, Iterator
from typing import Any

from .captioner import CaptionerPreset, caption_samples
from .model_spec import ModelSpec
from .recipes import Recipe

__all__ = ["SEQUENCE_KEYS", "batch_stream", "planned_tokens_per_step", "repad", "seq_keys", "spec_buckets"]

SEQUENCE_KEYS = (
    "input_ids", "attention_mask", "labels", "token_type_ids", "position_ids",
    "decoder_input_ids", "decoder_attention_mask",
)
"""Keys whose dim 1 is the sequence (marked dynamic by ``mark-dynamic``)."""

Prepare = Callable[[Callable[[dict[str, Any]], Any]], None]


def seq_keys(batch: dict[str, Any]) -> list[str]:
    """The keys of ``batch`` whose dim 1 is the sequence length (2-D tensors only)."""
    return [k for k in SEQUENCE_KEYS if k in batch and getattr(batch[k], "ndim", 0) >= 2]


def batch_stream(
    recipe: Recipe, spec: ModelSpec, preset: CaptionerPreset, device: Any
) -> tuple[Iterator[dict[str, Any]], Prepare | None]:
    """An endless iterator of batches for ``recipe``, and what to run before the first step.

    Args:
        recipe: the recipe (its ``data`` scheme).
        spec: the model spec; ``spec.make_batch`` is ``None`` for the built-in captioner.
        preset: the captioner's sizes (batch size, max length, buckets).
        device: unused here (steps move batches); kept for symmetry with user specs.

    Returns:
        ``(batches, prepare)``: ``prepare(forward_backward)`` compiles every shape up front
        (buckets), or is ``None``.
    """
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
        buckets = plan_buckets(lengths, max_buckets=preset.max_buckets, max_length=preset.max_length)
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
    """The buckets the ``buckets`` recipe pads a ``--model`` spec's batches to: planned from the
    spec's lengths, at most the preset's ``max_buckets``. The spec's own ``make_batch`` decides
    which samples share a batch (no bucket sampler groups them), so each batch is padded up to
    the smallest bucket that fits its longest sample.

    Example:
        >>> from torchcompile_kit.bench import PRESETS
        >>> spec_buckets([5, 6, 7, 30, 31, 200], PRESETS["tiny"])
        [8, 32, 200]
    """
    from torchcompile_kit import plan_buckets

    return plan_buckets(lengths, max_buckets=preset.max_buckets)


def planned_tokens_per_step(
    recipe: Recipe, spec: ModelSpec, preset: CaptionerPreset, device: Any, steps: int, *, samples: int = 2048
) -> float | None:
    """Mean computed (padded) tokens per step over a run of ``steps`` steps of ``recipe``'s batches.

    What a long run computes per step, which a few timed steps of a heavy-tailed length mix do
    not show: ``tune`` scales its measured step time to it. A ``--model`` spec's
    ``make_batch(step)`` is called at ``samples`` steps spread evenly over the run; the
    captioner's stream (its pool cycles every 64 batches) is read from the start, at most
    ``samples`` batches.

    Args:
        recipe: the recipe (its padding scheme).
        spec: the model spec.
        preset: the captioner's sizes.
        device: passed to :func:`batch_stream`.
        steps: the planned run's steps.
        samples: at most this many batches are built.

    Returns:
        The mean, or ``None`` when the batches carry no token tensor.

    Example:
        >>> planned_tokens_per_step(RECIPES["eager-longest"], spec, PRESETS["tiny"], "cpu", 20000)  # doctest: +SKIP
        1412.5
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


def repad(batch: dict[str, Any], collate: Callable[[list[dict[str, Any]]], dict[str, Any]]) -> dict[str, Any]:
    """Re-pad a ``--model`` batch the way ``collate`` (a :class:`PadToBucketCollator`) pads.

    Each row's real length is the sum of its attention mask (right padding assumed) or, without
    a mask, the full width; the row's sequence tensors are cut to it and the rows collated again,
    so the batch is padded to the bucket of its longest row. Other tensors pass through per row.

    Args:
        batch: what ``make_batch(step)`` returned.
        collate: the collator.

    Returns:
        The re-padded batch, with ``batch``'s keys (``batch`` itself when it has no sequence
        tensor).
    """
    keys = seq_keys(batch)
    if not keys:
        return batch
    mask = next((batch[k] for k in ("attention_mask", "decoder_attention_mask") if k in keys), None)
    features = []
    for i in range(batch[keys[0]].shape[0]):
        length = int(mask[i].sum()) if mask is not None else batch[keys[0]].shape[1]
        features.append({k: v[i, :length] if k in keys else v[i] for k, v in batch.items() if hasattr(v, "shape")})
    padded = collate(features)
    return {k: padded[k] for k in batch}  # the collator may add a mask the model does not take
