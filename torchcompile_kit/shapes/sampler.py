"""A batch sampler whose every batch pads to one bucket: what turns bucketing into speed.

With random batches almost every batch of 64 holds one long sample, so padding stays near 80% on a
long-tailed length mix whatever the buckets; grouping batches by bucket pads each sample only to
its own bucket (14% at 8 buckets on the same mix, see docs/shapes.md).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import torch

from .._checks import check_positive_int
from .planner import as_lengths, batch_sizes_for, bucket_for, carry_rule, check_buckets
from ..errors import BatchShapeError, SequenceTooLongError

__all__ = ["BucketBatchSampler"]


class BucketBatchSampler(torch.utils.data.Sampler[list[int]]):
    """Yield batches of indices whose samples all pad to one bucket, bounding the batch shapes.

    Each epoch the indices of every bucket are shuffled, cut into batches, and the batches of all
    buckets are shuffled together. A bucket's leftover samples (fewer than a batch) are *carried up*
    into the next bucket's batches (they fit there; each batch still holds at least one sample of
    its own bucket and pads to it), so only one partial batch per epoch remains (the last, padded
    to the largest non-empty bucket), dropped with ``drop_last=True``. The batch shapes are
    therefore ``(batch_size, bucket)`` per bucket plus at most one tail shape, the same every
    epoch: :meth:`batch_shapes` lists them and :meth:`warmup_indices` gives one real batch per
    shape for :func:`~torchcompile_kit.warmup_shapes`. (Why carry: a partial batch per bucket
    would double the shapes, and 2 × 8 exceeds dynamo's ``recompile_limit`` of 8.)

    Under DDP (``num_replicas > 1``) the epoch's batch list, identical on every rank, is dealt out
    round-robin; every rank gets the same number of batches: with ``drop_last=False`` the list is
    topped up by repeating its first batches (as ``DistributedSampler`` repeats samples), with
    ``drop_last=True`` the surplus batches are dropped, which keeps the shards disjoint.

    Args:
        lengths: token length of every sample of the dataset (index ``i`` -> ``lengths[i]``).
        buckets: strictly ascending padding lengths, e.g. from :func:`plan_buckets` given the same
            ``batch_size`` (and ``drop_last``, ``max_tokens``), so that the plan counts the carried
            leftovers; each length must fit the last bucket.
        batch_size: samples per batch (with ``max_tokens``: the largest batch size).
        shuffle: shuffle within and across buckets (``False``: ascending bucket order).
        drop_last: drop the one partial batch (and, under DDP, the surplus batches).
        seed: base seed; the epoch's order is drawn from ``seed + epoch`` (see :meth:`set_epoch`).
        num_replicas: number of DDP ranks; ``None`` reads ``torch.distributed`` when initialized,
            else 1. Exactly one party may shard: this sampler (``num_replicas`` = world size) or
            ``accelerate`` (``num_replicas=1, rank=0``; its ``BatchSamplerShard`` deals the
            batches out), never both, or each rank sees a quarter of the data on 2 ranks.
            ``torchcompile_kit.integrations`` (``prepare_bucket_dataloader``,
            ``CompileTrainer``) check this and make accelerate's wrapper a pass-through when
            the sampler shards.
        rank: this process's rank; ``None`` reads ``torch.distributed`` when initialized, else 0.
        max_tokens: a token budget: bucket ``b`` gets batches of
            ``min(batch_size, max(1, max_tokens // b))`` samples, so ``batch × length`` stays near
            constant while the number of shapes stays one per bucket.

    Attributes:
        batch_size: the size of every batch when all are equal, else ``None`` (``max_tokens``,
            or a partial batch): accelerate shards by it and must not trust a varying one.
        batch_sizes: the batch size of each bucket.

    Raises:
        SequenceTooLongError: a length exceeds the last bucket.
        ValueError: empty or non-positive lengths, bad buckets, sizes or rank.

    Example:
        >>> lengths = [5, 6, 30, 31, 7, 29]
        >>> sampler = BucketBatchSampler(lengths, [8, 32], batch_size=3, seed=0)
        >>> sorted(sorted(batch) for batch in sampler)
        [[0, 1, 4], [2, 3, 5]]
    """

    def __init__(
        self,
        lengths: Sequence[int] | torch.Tensor,
        buckets: Sequence[int],
        batch_size: int,
        *,
        shuffle: bool = True,
        drop_last: bool = False,
        seed: int = 0,
        num_replicas: int | None = None,
        rank: int | None = None,
        max_tokens: int | None = None,
    ) -> None:
        self.buckets = check_buckets(buckets)
        check_positive_int("batch_size", batch_size, error=BatchShapeError)
        if max_tokens is not None:
            check_positive_int("max_tokens", max_tokens, error=BatchShapeError)
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
        self.num_replicas, self.rank = _resolve_replicas(num_replicas, rank)
        self.shuffle = shuffle
        self.drop_last = drop_last
        self.seed = seed
        self.epoch = 0
        # `batch_size` means "every batch but the last has this size" to torch's BatchSampler and
        # to accelerate's BatchSamplerShard, which shards by it and silently drops batches of
        # another size (half the samples, unequal batch counts per rank: a DDP hang). Ours vary
        # with max_tokens and the partial batch is shuffled in anywhere, so then it is None, as
        # for transformers' own BatchRebalanceSampler.
        sizes = {len(batch) for batch in self._global_batches(None)}
        self.batch_size: int | None = sizes.pop() if len(sizes) == 1 else None

    def set_epoch(self, epoch: int) -> None:
        """Draw the next iteration's order from ``seed + epoch`` (call before each epoch).

        Args:
            epoch: the epoch number; the same ``(seed, epoch)`` gives the same batches.

        Example:
            >>> sampler = BucketBatchSampler([3, 4, 5], [8], batch_size=2)
            >>> sampler.set_epoch(1)
        """
        self.epoch = epoch

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

    def _shard(self, batches: list[list[int]]) -> list[list[int]]:
        if self.num_replicas == 1:
            return batches
        if self.drop_last:
            batches = batches[: len(batches) - len(batches) % self.num_replicas]
        else:
            missing = -len(batches) % self.num_replicas
            batches = batches + (batches * (missing // max(len(batches), 1) + 1))[:missing]
        return batches[self.rank :: self.num_replicas]

    def __iter__(self) -> Iterator[list[int]]:
        generator = None
        if self.shuffle:
            generator = torch.Generator().manual_seed(self.seed + self.epoch)
        yield from self._shard(self._global_batches(generator))

    def __len__(self) -> int:
        # the batch count depends only on the bucket sizes, not on the shuffle
        return len(self._shard(self._global_batches(None)))

    def warmup_indices(self) -> list[list[int]]:
        """One batch of real indices for each distinct batch shape this sampler yields.

        Collate each and pass them to :func:`~torchcompile_kit.warmup_shapes` so every graph is
        compiled before training starts. Under DDP every rank gets every shape (a rank may meet
        any of them), so warm up all of them on every rank.

        Returns:
            Index lists in the order of :meth:`batch_shapes`.

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
        """The distinct ``(batch_size, bucket_length)`` pairs of the batches, every epoch.

        Returns:
            Pairs in ascending bucket order; the tail batch (``drop_last=False``) comes last.

        Example:
            >>> BucketBatchSampler([5, 6, 30, 31, 7], [8, 32], batch_size=2).batch_shapes()
            [(2, 8), (2, 32), (1, 32)]
        """
        return [self._shape(batch) for batch in self.warmup_indices()]

    def _shape(self, batch: list[int]) -> tuple[int, int]:
        return len(batch), self.buckets[max(self._bucket_of[i] for i in batch)]

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(buckets={self.buckets!r}, batch_sizes={self.batch_sizes!r}, "
            f"shuffle={self.shuffle!r}, drop_last={self.drop_last!r}, seed={self.seed!r}, "
            f"num_replicas={self.num_replicas!r}, rank={self.rank!r})"
        )


def _resolve_replicas(num_replicas: int | None, rank: int | None) -> tuple[int, int]:
    distributed = torch.distributed.is_available() and torch.distributed.is_initialized()
    if num_replicas is None:
        num_replicas = torch.distributed.get_world_size() if distributed else 1
    if rank is None:
        rank = torch.distributed.get_rank() if distributed else 0
    check_positive_int("num_replicas", num_replicas, error=BatchShapeError)
    if isinstance(rank, bool) or not isinstance(rank, int) or not 0 <= rank < num_replicas:
        raise BatchShapeError(
            f"rank must be an int in [0, num_replicas={num_replicas}), got {rank!r}"
        )
    return num_replicas, rank
