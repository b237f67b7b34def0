"""accelerate: a bucket data loader sharded exactly once, and a regionally compiled model.

``accelerator.prepare(compile_regional(model))`` needs nothing from here, and the bucket sampler
leaves the dealing out of batches to accelerate's ``BatchSamplerShard`` when it wraps it;
:func:`prepare_bucket_dataloader` adds argument checks and ``set_epoch`` on accelerate's wrapper
(docs/integrations.md, "accelerate").
"""

from __future__ import annotations

from typing import Any

import torch

from ..errors import BatchShapeError
from ..shapes import BucketBatchSampler

__all__ = ["prepare_bucket_dataloader"]


def prepare_bucket_dataloader(
    accelerator: Any,
    dataset: Any,
    *,
    sampler: BucketBatchSampler,
    collate_fn: Any,
    **dataloader_kwargs: Any,
) -> Any:
    """``accelerator.prepare`` a ``DataLoader`` over a bucket sampler, sharded exactly once.

    The loader ``accelerator.prepare(DataLoader(dataset, batch_sampler=sampler))`` gives, plus two
    things: arguments the sampler decides are refused, and accelerate's ``BatchSamplerShard`` gets a
    ``set_epoch`` that reaches the sampler (Trainer calls it there when it resumes).

    Args:
        accelerator: the ``accelerate.Accelerator``.
        dataset: a map-style dataset; ``dataset[i]`` is sample ``i`` of ``sampler``'s lengths.
        sampler: the bucket sampler.
        collate_fn: e.g. :class:`~torchcompile_kit.PadToBucketCollator`.
        **dataloader_kwargs: other ``DataLoader`` arguments (not ``batch_size``/``shuffle``/
            ``sampler``/``drop_last``, which the sampler decides).

    Returns:
        The prepared loader (accelerate's ``DataLoaderShard``).

    Raises:
        BatchShapeError: ``sampler`` was built for another number of processes, or
            ``dataloader_kwargs`` holds an argument the batch sampler decides.

    Example:
        >>> sampler = BucketBatchSampler(lengths, buckets, batch_size=8)  # doctest: +SKIP
        >>> loader = prepare_bucket_dataloader(accelerator, dataset, sampler=sampler,
        ...     collate_fn=PadToBucketCollator(buckets=buckets))  # doctest: +SKIP
    """
    clash = sorted({"batch_size", "shuffle", "sampler", "drop_last"} & set(dataloader_kwargs))
    if clash:
        raise BatchShapeError(
            f"prepare_bucket_dataloader: {clash!r} are decided by the "
            "BucketBatchSampler; drop them and set "
            "batch_size/shuffle/drop_last on the sampler"
        )
    check_sharding(sampler, accelerator.num_processes)
    loader = torch.utils.data.DataLoader(
        dataset, batch_sampler=sampler, collate_fn=collate_fn, **dataloader_kwargs
    )
    return shard_once(accelerator.prepare(loader), sampler)


def check_sharding(sampler: BucketBatchSampler, num_processes: int) -> None:
    """Raise unless ``sampler`` was built for all processes or for one (``num_replicas=1``)."""
    if sampler.num_replicas not in (1, num_processes):
        raise BatchShapeError(
            "the BucketBatchSampler was built for "
            f"num_replicas={sampler.num_replicas!r} but {num_processes!r} "
            "processes train; build it with num_replicas=None after the "
            "Accelerator/TrainingArguments exist (the sampler shards), or "
            "num_replicas=1, rank=0 (accelerate shards)"
        )


def shard_once(loader: Any, sampler: BucketBatchSampler) -> Any:
    """After ``accelerator.prepare``: tell ``sampler`` that accelerate deals its batches, and give
    accelerate's wrapper a ``set_epoch`` reaching the sampler.

    The sampler then yields the whole epoch to ``BatchSamplerShard``, which deals it out once
    (:meth:`BucketBatchSampler.deal_with_accelerate`). ``BatchSamplerShard`` has no
    ``set_epoch``; ``DataLoaderShard`` reaches the sampler through ``sampler.sampler``, but behind
    ``skip_first_batches``' ``SkipBatchSampler`` it cannot, and transformers' Trainer then calls
    ``set_epoch`` on the ``BatchSamplerShard`` itself. A ``DataLoaderDispatcher``
    (``dispatch_batches=True``) is refused: process 0 would fetch and concatenate every process's
    batches, which differ in length by bucket.
    """
    if type(loader).__name__ == "DataLoaderDispatcher":
        raise BatchShapeError(
            "BucketBatchSampler under accelerate's dispatch_batches=True: process 0 would fetch "
            "and concatenate every process's batches, which differ in length by bucket (and "
            "would see only its own share of this sampler's). Use "
            "Accelerator(dataloader_config=DataLoaderConfiguration(dispatch_batches=False)), the "
            "default for map-style datasets: each process then fetches its own batches."
        )
    wrapper = getattr(loader, "batch_sampler", None)
    if (
        wrapper is None
        or wrapper is sampler
        or getattr(wrapper, "batch_sampler", None) is not sampler
    ):
        sampler.deal_with_accelerate(1)  # one process: nothing to deal out
        return loader
    sampler.deal_with_accelerate(wrapper.num_processes, split_batches=wrapper.split_batches)
    wrapper.set_epoch = sampler.set_epoch
    return loader
