"""accelerate: a bucket data loader sharded exactly once, and a regionally compiled model.

``accelerator.prepare(compile_regional(model))`` needs nothing from here: accelerate keeps the
same object (blocks compiled in place), ``save_state``/``load_state`` round-trip and the keys
stay clean. The data loader is the trap. ``prepare`` wraps a batch sampler in
``BatchSamplerShard``, which deals the batches out to the processes by trusting ``.batch_size``;
:class:`~torchcompile_kit.BucketBatchSampler` can shard by itself too (``num_replicas``), and
when both shard, each of 2 ranks sees a quarter of the data. :func:`prepare_bucket_dataloader`
lets exactly one of them shard: the sampler when it was built for all processes (the default
once ``Accelerator()`` initialized ``torch.distributed``), else accelerate.
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

    Every rank gets the same number of batches (no rank waits in an all-reduce the others never
    reach). ``loader.set_epoch(epoch)`` (which accelerate also calls each time the loader is
    iterated) reaches the sampler on any number of processes.

    Who shards:

    * ``sampler.num_replicas == accelerator.num_processes`` (> 1): the sampler deals the batches
      out; accelerate's ``BatchSamplerShard`` is made a pass-through, as transformers' Trainer
      does for its own ``BatchRebalanceSampler``.
    * ``sampler.num_replicas == 1``: accelerate shards. It takes the sampler's ``batch_size``,
      which is ``None`` whenever batch sizes vary (``max_tokens``, a partial batch), so no batch
      is dropped; a batch count that is not a multiple of the processes is topped up with the
      first batches (``drop_last=False``) or cut (``drop_last=True``).

    Args:
        accelerator: the ``accelerate.Accelerator``.
        dataset: a map-style dataset; ``dataset[i]`` is sample ``i`` of ``sampler``'s lengths.
        sampler: the bucket sampler.
        collate_fn: e.g. :class:`~torchcompile_kit.PadToBucketCollator`.
        **dataloader_kwargs: other ``DataLoader`` arguments (``num_workers``, ``pin_memory``);
            not ``batch_size``/``shuffle``/``sampler``/``drop_last``, which the sampler decides.

    Returns:
        The prepared loader (accelerate's ``DataLoaderShard``).

    Raises:
        BatchShapeError: ``sampler`` was built for another number of processes, or
            ``dataloader_kwargs`` holds an argument the batch sampler decides.

    Example:
        >>> accelerator = Accelerator()  # doctest: +SKIP
        >>> sampler = BucketBatchSampler(lengths, buckets, batch_size=8)  # doctest: +SKIP
        >>> loader = prepare_bucket_dataloader(accelerator, dataset, sampler=sampler,
        ...     collate_fn=PadToBucketCollator(buckets=buckets))  # doctest: +SKIP
    """
    clash = sorted({"batch_size", "shuffle", "sampler", "drop_last"} & set(dataloader_kwargs))
    if clash:
        raise BatchShapeError(
            f"prepare_bucket_dataloader: {clash!r} are decided by the BucketBatchSampler; drop "
            "them and set batch_size/shuffle/drop_last on the sampler"
        )
    check_sharding(sampler, accelerator.num_processes)
    loader = torch.utils.data.DataLoader(
        dataset, batch_sampler=sampler, collate_fn=collate_fn, **dataloader_kwargs
    )
    return shard_once(accelerator.prepare(loader), sampler)


def check_sharding(sampler: BucketBatchSampler, num_processes: int) -> None:
    """Raise unless ``sampler`` shards for all processes or leaves sharding to accelerate."""
    if sampler.num_replicas not in (1, num_processes):
        raise BatchShapeError(
            f"the BucketBatchSampler was built for num_replicas={sampler.num_replicas!r} but "
            f"{num_processes!r} processes train; build it with num_replicas=None after the "
            "Accelerator/TrainingArguments exist (the sampler shards), or num_replicas=1, rank=0 "
            "(accelerate shards)"
        )


def shard_once(loader: Any, sampler: BucketBatchSampler) -> Any:
    """After ``accelerator.prepare``: neutralise accelerate's sharding if the sampler shards.

    Also gives accelerate's wrapper a ``set_epoch`` that reaches the sampler: ``DataLoaderShard``
    forwards ``set_epoch`` only to a batch sampler that has one, and ``BatchSamplerShard`` has none.
    """
    wrapper = getattr(loader, "batch_sampler", None)
    if (
        wrapper is None
        or wrapper is sampler
        or getattr(wrapper, "batch_sampler", None) is not sampler
    ):
        return loader
    if sampler.num_replicas > 1:
        wrapper.num_processes = 1
        wrapper.process_index = 0
    wrapper.set_epoch = sampler.set_epoch
    return loader
