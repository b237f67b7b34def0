"""A batch sampler whose every batch pads to one bucket: what turns bucketing into speed (random
batches of 64 pad near 80% on a long-tailed mix whatever the buckets; docs/shapes.md).
"""

from __future__ import annotations

import sys
from collections.abc import Iterator, Sequence
from types import FrameType
from typing import Any

import torch

from .._checks import check_positive_int
from ..errors import BatchShapeError, SequenceTooLongError
from .planner import (
    as_lengths,
    batch_sizes_for,
    bucket_for,
    carry_rule,
    check_buckets,
    check_token_budget,
)

__all__ = ["BucketBatchSampler"]


class BucketBatchSampler(torch.utils.data.Sampler[list[int]]):
    """Yield batches of indices whose samples all pad to one bucket, bounding the batch shapes.

    Each epoch the indices of every bucket are shuffled, cut into batches, and the batches of all
    buckets shuffled together; a bucket's leftover samples are carried up into the next bucket's
    batches, so only the epoch's last batch can be partial. The shapes, ``(batch_size, bucket)`` per
    bucket plus at most that one, are the same every epoch (:meth:`batch_shapes`,
    :meth:`warmup_indices`). The order is drawn from ``seed + epoch`` (:meth:`set_epoch`). Under DDP
    or accelerate the epoch's batches are dealt out exactly once, the same number to every rank;
    accelerate's ``dispatch_batches=True`` is refused. docs/shapes.md ("BucketBatchSampler") has the
    epoch, sharding and resume rules.

    Args:
        lengths: token length of every sample of the dataset (index ``i`` -> ``lengths[i]``).
        buckets: strictly ascending padding lengths, e.g. from :func:`plan_buckets` given the same
            ``batch_size`` (and ``drop_last``, ``max_tokens``); each length must fit the last bucket.
        batch_size: samples per batch (with ``max_tokens``: the largest batch size).
        shuffle: shuffle within and across buckets (``False``: ascending bucket order).
        drop_last: drop the one partial batch (and, under DDP, the surplus batches).
        seed: base seed; the epoch's order is drawn from ``seed + epoch``.
        num_replicas: ranks this sampler deals to when iterated directly; ``None`` reads
            ``torch.distributed`` at each iteration (1 when it is not initialized). Under
            accelerate's ``BatchSamplerShard`` accelerate deals, and an explicit value other than 1
            or its ``num_processes`` raises.
        rank: this process's rank; ``None`` reads ``torch.distributed`` like ``num_replicas``.
        max_tokens: a token budget: bucket ``b`` gets batches of
            ``min(batch_size, max(1, max_tokens // b))`` samples.

    Attributes:
        sampler: what accelerate's ``DataLoaderShard.set_epoch`` reaches; forwards to :meth:`set_epoch`.
        batch_size: the size of every batch when all are equal, else ``None``.
        batch_sizes: the batch size of each bucket.

    Raises:
        SequenceTooLongError: a length exceeds the last bucket.
        ValueError: empty or non-positive lengths, bad buckets, sizes or rank, or a bucket
            longer than ``max_tokens``.
        BatchShapeError: (when iterated) ``num_replicas``/``rank`` disagree with accelerate's
            ``BatchSamplerShard`` around the sampler.

    Example:
        >>> lengths = [5, 6, 30, 31, 7, 29]
        >>> sampler = BucketBatchSampler(lengths, [8, 32], batch_size=3, seed=0)
        >>> sorted(sorted(batch) for batch in sampler)
        [[0, 1, 4], [2, 3, 5]]
    """

    def __init__(self, lengths: Sequence[int] | torch.Tensor, buckets: Sequence[int],
                 batch_size: int, *, shuffle: bool = True, drop_last: bool = False, seed: int = 0,
                 num_replicas: int | None = None, rank: int | None = None,
                 max_tokens: int | None = None) -> None:
        self.buckets = check_buckets(buckets)
        check_positive_int("batch_size", batch_size, error=BatchShapeError)
        if max_tokens is not None:
            check_positive_int("max_tokens", max_tokens, error=BatchShapeError)
        check_token_budget(self.buckets, max_tokens, caller="BucketBatchSampler")
        values = as_lengths(lengths)
        self._members: list[list[int]] = [[] for _ in self.buckets]
        self._bucket_of: list[int] = []  # index -> position of its bucket
        for index, length in enumerate(values):
            bucket = bucket_for(length, self.buckets)
            if bucket < 0:
                raise SequenceTooLongError(
                    f"lengths[{index}] is {length!r}, longer than the last bucket "
                    f"{self.buckets[-1]!r}; if the collator truncates (PadToBucketCollator("
                    f"max_length={self.buckets[-1]})), pass min(length, {self.buckets[-1]}) here"
                )
            self._bucket_of.append(self.buckets.index(bucket))
            self._members[self._bucket_of[-1]].append(index)
        self.batch_sizes = batch_sizes_for(self.buckets, batch_size, max_tokens)
        _resolve_replicas(num_replicas, rank)  # check explicit values now
        self._num_replicas, self._rank = num_replicas, rank
        self.shuffle = shuffle
        self.drop_last = drop_last
        self.seed = seed
        self.epoch = 0
        self._epoch_used = False  # an iteration drew from `epoch` since set_epoch
        self.sampler = _EpochRelay(self)
        # `batch_size` means "every batch but the last has this size" to torch's BatchSampler and
        # to accelerate's BatchSamplerShard, which shards by it and silently drops batches of
        # another size (half the samples, unequal batch counts per rank: a DDP hang). Ours vary
        # with max_tokens and the partial batch is shuffled in anywhere, so then it is None, as
        # for transformers' own BatchRebalanceSampler.
        sizes = {len(batch) for batch in self._global_batches(None)}
        self.batch_size: int | None = sizes.pop() if len(sizes) == 1 else None

    @property
    def num_replicas(self) -> int:
        """The number of ranks (given, or ``torch.distributed``'s world size now, else 1)."""
        return _resolve_replicas(self._num_replicas, self._rank)[0]

    @property
    def rank(self) -> int:
        """This process's rank (given, or ``torch.distributed``'s rank now, else 0)."""
        return _resolve_replicas(self._num_replicas, self._rank)[1]

    def set_epoch(self, epoch: int) -> None:
        """Draw the next iteration's order from ``seed + epoch`` (optional: without it each iteration
        uses the epoch after the previous one). Call it to resume or to pin the order.

        Example:
            >>> sampler = BucketBatchSampler([3, 4, 5], [8], batch_size=2)
            >>> sampler.set_epoch(1)
        """
        self.epoch = epoch
        self._epoch_used = False

    def _global_batches(self, generator: torch.Generator | None) -> list[list[int]]:
        """Every batch of the epoch, on every rank alike (before sharding).

        Buckets are visited shortest first; ``carry`` holds the samples of shorter buckets that did
        not fill a batch, in ascending bucket order. Each full batch gets one sample of its own
        bucket (so it pads to that bucket) and is then filled with carried samples first. Which
        samples end up where is random, but how many of each bucket go into each batch is not,
        so the batch shapes are the same every epoch.
        """
        batches: list[list[int]] = []
        carry: list[int] = []
        last_size = self.batch_sizes[-1]
        for members, size in zip(self._members, self.batch_sizes):
            if not members:
                continue
            last_size = size
            if generator is not None:
                members = [members[i] for i in torch.randperm(len(members), generator=generator)]
            full, n_carried, used = carry_rule(len(carry), len(members), size)
            fill = carry[:n_carried] + members[full:used]
            batches.extend([members[j], *fill[j * (size - 1) : (j + 1) * (size - 1)]]
                           for j in range(full))
            carry = carry[n_carried:] + members[used:]
        if carry and not self.drop_last:
            batches.extend(carry[i : i + last_size] for i in range(0, len(carry), last_size))
        if generator is not None:
            batches = [batches[i] for i in torch.randperm(len(batches), generator=generator)]
        return batches

    def _parts(self, caller: FrameType | None) -> tuple[int, int | None]:
        """``(P, rank)`` to deal to, ``rank=None``: the whole list (accelerate deals it out)."""
        wrapper = _accelerate_wrapper(self, caller)
        if wrapper is None:
            _refuse_dispatcher(caller)
            return self.num_replicas, self.rank
        if wrapper.split_batches:  # accelerate splits each batch across the processes
            return 1, None
        processes = wrapper.num_processes
        if self._num_replicas not in (None, 1, processes) or (
            self._num_replicas == processes and self._rank not in (None, wrapper.process_index)
        ):
            raise BatchShapeError(f"BucketBatchSampler(num_replicas={self._num_replicas!r}, "
                                  f"rank={self._rank!r}) is dealt out by accelerate to process "
                                  f"{wrapper.process_index!r} of {processes!r}; build it with "
                                  "num_replicas=None, rank=None (accelerate deals the batches, "
                                  "each once)")
        return processes, None

    def _deal(self, batches: list[list[int]], parts: int, rank: int | None) -> list[list[int]]:
        """Make ``batches`` a multiple of ``parts`` long (top-up or cut), then take a rank's."""
        if parts > 1:
            if self.drop_last:
                batches = batches[: len(batches) - len(batches) % parts]
            else:
                missing = -len(batches) % parts
                batches = batches + (batches * (missing // max(len(batches), 1) + 1))[:missing]
        return batches if rank is None else batches[rank::parts]

    def __iter__(self) -> Iterator[list[int]]:
        # not a generator: the caller (accelerate's BatchSamplerShard or not) is the frame below
        parts, rank = self._parts(sys._getframe(1))
        if self._epoch_used:  # no set_epoch since the last iteration: the next epoch
            self.epoch += 1
        self._epoch_used = True
        generator = None
        if self.shuffle:
            generator = torch.Generator().manual_seed(self.seed + self.epoch)
        return iter(self._deal(self._global_batches(generator), parts, rank))

    def __len__(self) -> int:
        # the batch count depends only on the bucket sizes, not on the shuffle
        parts, rank = self._parts(sys._getframe(1))
        return len(self._deal(self._global_batches(None), parts, rank))

    def warmup_indices(self) -> list[list[int]]:
        """One batch of real indices per distinct batch shape (in :meth:`batch_shapes` order), for
        :func:`~torchcompile_kit.warmup_shapes`; under DDP warm up all of them on every rank.

        Example:
            >>> sampler = BucketBatchSampler([5, 6, 30, 31, 7], [8, 32], batch_size=2)
            >>> [len(batch) for batch in sampler.warmup_indices()]
            [2, 2, 1]
        """
        firsts: dict[tuple[int, int], list[int]] = {}
        for batch in self._global_batches(None):
            firsts.setdefault(self._shape(batch), batch)
        return list(firsts.values())

    def batch_shapes(self) -> list[tuple[int, int]]:
        """The distinct ``(batch_size, bucket_length)`` pairs of every epoch, ascending, tail last.

        Example:
            >>> BucketBatchSampler([5, 6, 30, 31, 7], [8, 32], batch_size=2).batch_shapes()
            [(2, 8), (2, 32), (1, 32)]
        """
        return [self._shape(batch) for batch in self.warmup_indices()]

    def _shape(self, batch: list[int]) -> tuple[int, int]:
        return len(batch), self.buckets[max(self._bucket_of[i] for i in batch)]

    def __repr__(self) -> str:
        return (f"{type(self).__name__}(buckets={self.buckets!r}, "
                f"batch_sizes={self.batch_sizes!r}, shuffle={self.shuffle!r}, "
                f"drop_last={self.drop_last!r}, seed={self.seed!r}, "
                f"num_replicas={self.num_replicas!r}, rank={self.rank!r})")


class _EpochRelay:
    """``BucketBatchSampler.sampler``: where accelerate's ``set_epoch`` looks, forwarding it."""

    __slots__ = ("_owner",)

    def __init__(self, owner: BucketBatchSampler) -> None:
        self._owner = owner

    def set_epoch(self, epoch: int) -> None:
        self._owner.set_epoch(epoch)

    def __repr__(self) -> str:
        return f"<set_epoch relay of {type(self._owner).__name__}>"


def _accelerate_wrapper(sampler: BucketBatchSampler, caller: FrameType | None) -> Any | None:
    """accelerate's ``BatchSamplerShard`` when it is what iterates (or measures) ``sampler``, found
    in the caller's frame (accelerate offers no opt-out; tests/integrations/test_accelerate.py checks
    it against the installed accelerate). A pass-through wrapper (``num_processes == 1``) counts as none.
    """
    module = sys.modules.get("accelerate.data_loader")  # never imported from here
    if module is None or caller is None:
        return None
    wrapper = caller.f_locals.get("self")
    if (
        isinstance(wrapper, module.BatchSamplerShard)
        and wrapper.batch_sampler is sampler
        and wrapper.num_processes > 1
    ):
        return wrapper
    return None


def _refuse_dispatcher(caller: FrameType | None) -> None:
    """Raise when accelerate's ``DataLoaderDispatcher`` (``dispatch_batches=True``) iterates us: it
    concatenates process 0's batches (different buckets do not concatenate, and the other ranks'
    batches would never be seen). The frames up to torch's loader iterator are searched.
    """
    module = sys.modules.get("accelerate.data_loader")  # never imported from here
    if module is None:
        return
    frame, depth = caller, 0
    dispatcher = module.DataLoaderDispatcher
    while frame is not None and not isinstance(frame.f_locals.get("self"), dispatcher):
        frame, depth = frame.f_back, depth + 1
        if depth == 8:
            return
    if frame is not None:
        raise BatchShapeError(
            "BucketBatchSampler under accelerate's dispatch_batches=True: process 0 would fetch "
            "and concatenate every process's batches, which differ in length by bucket (and "
            "would see only its own share of this sampler's). Use "
            "Accelerator(dataloader_config=DataLoaderConfiguration(dispatch_batches=False)), the "
            "default for map-style datasets: each process then fetches its own batches."
        )


def _resolve_replicas(num_replicas: int | None, rank: int | None) -> tuple[int, int]:
    distributed = torch.distributed.is_available() and torch.distributed.is_initialized()
    if num_replicas is None:
        num_replicas = torch.distributed.get_world_size() if distributed else 1
    if rank is None:
        rank = torch.distributed.get_rank() if distributed else 0
    check_positive_int("num_replicas", num_replicas, error=BatchShapeError)
    if isinstance(rank, bool) or not isinstance(rank, int) or not 0 <= rank < num_replicas:
        raise BatchShapeError(f"rank must be an int in [0, num_replicas={num_replicas}), got "
                              f"{rank!r}")
    return num_replicas, rank
