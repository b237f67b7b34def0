"""A batch sampler whose every batch pads to one bucket: what turns bucketing into speed (random
batches of 64 pad near 80% on a long-tailed mix whatever the buckets; docs/shapes.md).
"""

from __future__ import annotations

import sys
from collections.abc import Iterator, Sequence

import torch

from .._checks import check_positive_int
from .._moved import refuses_moved
from ..errors import BatchShapeError, SequenceTooLongError
from .planner import (
    Batching,
    as_lengths,
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
    or accelerate the epoch's batches are dealt out exactly once, the same number to every rank:
    by the sampler itself (``num_replicas``/``rank``), or by accelerate's ``BatchSamplerShard`` once
    :meth:`deal_with_accelerate` said so (``prepare_bucket_dataloader`` and ``CompileTrainer`` call
    it). Under accelerate on several processes, a sampler told neither refuses to guess.
    docs/shapes.md ("BucketBatchSampler") has the epoch, sharding and resume rules.

    Args:
        lengths: token length of every sample of the dataset (index ``i`` -> ``lengths[i]``).
        buckets: strictly ascending padding lengths, e.g. from :func:`plan_buckets` given the same
            :class:`~torchcompile_kit.shapes.Batching`; each length must fit the last bucket.
        batch_size: samples per batch (with ``max_tokens``: the largest batch size).
        drop_last: drop the one partial batch (and, under DDP, the surplus batches).
        seed: the shuffle's base seed, the same on every rank: the epoch's order is drawn from
            ``seed + epoch``; ``None``: no shuffle, batches in ascending bucket order.
        num_replicas: ranks this sampler deals to when it deals itself; ``None`` reads
            ``torch.distributed`` at each iteration (1 when it is not initialized). With
            accelerate dealing (:meth:`deal_with_accelerate`), a value other than 1 or its
            ``num_processes`` raises.
        rank: this process's rank; ``None`` reads ``torch.distributed`` like ``num_replicas``.
        max_tokens: a token budget: bucket ``b`` gets batches of
            ``min(batch_size, max(1, max_tokens // b))`` samples.

    Attributes:
        sampler: what accelerate's ``DataLoaderShard.set_epoch`` reaches; forwards to
            :meth:`set_epoch`.
        batch_size: the size of every batch when all are equal, else ``None``.
        batch_sizes: the batch size of each bucket.
        batching: its :class:`~torchcompile_kit.shapes.Batching`, to give :func:`plan_buckets`
            and :func:`estimate_padding`.

    Raises:
        SequenceTooLongError: a length exceeds the last bucket.
        ValueError: empty or non-positive lengths, bad buckets, sizes or rank, or a bucket
            longer than ``max_tokens``.
        BatchShapeError: (when iterated) ``num_replicas``/``rank`` disagree with the processes
            that deal its batches, or accelerate runs several processes and the sampler was told
            neither who deals nor ``num_replicas``.

    Example:
        >>> lengths = [5, 6, 30, 31, 7, 29]
        >>> sampler = BucketBatchSampler(lengths, [8, 32], batch_size=3, seed=0)
        >>> sorted(sorted(batch) for batch in sampler)
        [[0, 1, 4], [2, 3, 5]]
    """

    @refuses_moved
    def __init__(
        self,
        lengths: Sequence[int] | torch.Tensor,
        buckets: Sequence[int],
        batch_size: int,
        *,
        drop_last: bool = False,
        seed: int | None = 0,
        num_replicas: int | None = None,
        rank: int | None = None,
        max_tokens: int | None = None,
    ) -> None:
        self.buckets = check_buckets(buckets)
        self.batching = Batching(batch_size, drop_last, max_tokens)
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
        self.batch_sizes = self.batching.sizes(self.buckets)
        _resolve_replicas(num_replicas, rank)  # check explicit values now
        self._num_replicas, self._rank = num_replicas, rank
        self.drop_last = drop_last
        if seed is not None and (not isinstance(seed, int) or isinstance(seed, bool)):
            raise BatchShapeError(
                f"seed={seed!r}: pass an int (the shuffle's seed, the same on every rank) or "
                "None (no shuffle)"
            )
        self.seed = seed
        self.epoch = 0
        self._epoch_used = False  # an iteration drew from `epoch` since set_epoch
        self.sampler = _EpochRelay(self)
        self._accelerate: tuple[int, bool] | None = None  # (num_processes, split_batches)
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

    def deal_with_accelerate(self, num_processes: int, *, split_batches: bool = False) -> None:
        """Say that accelerate's ``BatchSamplerShard`` deals this sampler's batches out to
        ``num_processes`` processes (``accelerator.prepare(DataLoader(ds,
        batch_sampler=sampler))``): the sampler then yields the whole epoch, topped up to a multiple
        of ``num_processes``, and accelerate deals it once. ``prepare_bucket_dataloader`` and
        ``CompileTrainer`` call it; call it yourself before iterating a loader you prepared with
        ``accelerator.prepare``.

        Example:
            >>> sampler = BucketBatchSampler([5, 6, 30, 31, 7, 29], [8, 32], batch_size=1)
            >>> sampler.deal_with_accelerate(4)
            >>> len(sampler)  # 6 batches topped up to 8, for accelerate to deal 2 to each process
            8
        """
        check_positive_int("num_processes", num_processes, error=BatchShapeError)
        self._accelerate = (num_processes, bool(split_batches))

    def set_epoch(self, epoch: int) -> None:
        """Draw the next iteration's order from ``seed + epoch`` (optional: without it each
        iteration uses the epoch after the previous one). Call it to resume or to pin the order.

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
            batches.extend(
                [members[j], *fill[j * (size - 1) : (j + 1) * (size - 1)]] for j in range(full)
            )
            carry = carry[n_carried:] + members[used:]
        if carry and not self.drop_last:
            batches.extend(carry[i : i + last_size] for i in range(0, len(carry), last_size))
        if generator is not None:
            batches = [batches[i] for i in torch.randperm(len(batches), generator=generator)]
        return batches

    def _parts(self) -> tuple[int, int | None]:
        """``(P, rank)`` to deal to, ``rank=None``: the whole list (accelerate deals it out)."""
        if self._accelerate is None:
            _refuse_guessing(self._num_replicas)
            return self.num_replicas, self.rank
        processes, split_batches = self._accelerate
        if split_batches:  # accelerate splits each batch across the processes
            return 1, None
        if self._num_replicas not in (None, 1, processes):
            raise BatchShapeError(
                f"BucketBatchSampler(num_replicas={self._num_replicas!r}, "
                f"rank={self._rank!r}) is dealt out by accelerate to "
                f"{processes!r} processes; build it with num_replicas=None, "
                "rank=None (accelerate deals the batches, each once)"
            )
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
        parts, rank = self._parts()
        if self._epoch_used:  # no set_epoch since the last iteration: the next epoch
            self.epoch += 1
        self._epoch_used = True
        generator = None
        if self.seed is not None:
            generator = torch.Generator().manual_seed(self.seed + self.epoch)
        return iter(self._deal(self._global_batches(generator), parts, rank))

    def __len__(self) -> int:
        # the batch count depends only on the bucket sizes, not on the shuffle
        parts, rank = self._parts()
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
        return (
            f"{type(self).__name__}(buckets={self.buckets!r}, "
            f"batch_sizes={self.batch_sizes!r}, "
            f"drop_last={self.drop_last!r}, seed={self.seed!r}, "
            f"num_replicas={self.num_replicas!r}, rank={self.rank!r})"
        )


class _EpochRelay:
    """``BucketBatchSampler.sampler``: where accelerate's ``set_epoch`` looks, forwarding it."""

    __slots__ = ("_owner",)

    def __init__(self, owner: BucketBatchSampler) -> None:
        self._owner = owner

    def set_epoch(self, epoch: int) -> None:
        self._owner.set_epoch(epoch)

    def __repr__(self) -> str:
        return f"<set_epoch relay of {type(self._owner).__name__}>"


def _refuse_guessing(num_replicas: int | None) -> None:
    """Raise when an accelerate ``Accelerator`` (``accelerate.state.is_initialized()``: also
    Trainer's) runs several processes and the sampler was told neither that
    accelerate deals (:meth:`BucketBatchSampler.deal_with_accelerate`) nor ``num_replicas``: it
    cannot tell ``accelerator.prepare``'s ``BatchSamplerShard`` (which deals the batches itself:
    dealing them here too would drop all but a share) from a loader it iterates directly."""
    distributed = torch.distributed.is_available() and torch.distributed.is_initialized()
    state = sys.modules.get("accelerate.state")  # never imported from here
    if num_replicas is not None or state is None or not distributed or not state.is_initialized():
        return
    world = torch.distributed.get_world_size()
    if world > 1:
        raise BatchShapeError(
            f"BucketBatchSampler beside an accelerate Accelerator on {world} processes: who deals "
            "its batches? "
            "If accelerator.prepare wrapped the loader, call "
            "sampler.deal_with_accelerate(accelerator.num_processes) first (or build the loader "
            "with torchcompile_kit.integrations.prepare_bucket_dataloader, which does); if you "
            f"iterate it yourself, pass num_replicas={world} and rank=<this process's rank>."
        )


def _resolve_replicas(num_replicas: int | None, rank: int | None) -> tuple[int, int]:
    distributed = torch.distributed.is_available() and torch.distributed.is_initialized()
    if num_replicas is None:
        num_replicas = torch.distributed.get_world_size() if distributed else 1
    if rank is None:
        rank = torch.distributed.get_rank() if distributed else 0
    check_positive_int("num_replicas", num_replicas, error=BatchShapeError)
    world = torch.distributed.get_world_size() if distributed else 1
    if world > 1 and num_replicas not in (1, world):
        raise BatchShapeError(
            f"num_replicas={num_replicas!r}, but torch.distributed runs {world} "
            f"processes: pass num_replicas={world} (or None), or 1 for a "
            "sampler another dealer shards"
        )
    if isinstance(rank, bool) or not isinstance(rank, int) or not 0 <= rank < num_replicas:
        raise BatchShapeError(
            f"rank must be an int in [0, num_replicas={num_replicas}), got {rank!r}"
        )
    return num_replicas, rank
