"""Choose bucket lengths: the fewest padded tokens for a bounded number of shapes.

:func:`plan_buckets` plans for batches grouped by bucket
(:class:`~torchcompile_kit.BucketBatchSampler`), optionally with the sampler's own
:class:`Batching` and carry rule (:func:`carry_rule`); :func:`estimate_padding` says how much
padding a plan gives.
docs/shapes.md says why.
"""

from __future__ import annotations

import bisect
import itertools
import operator
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import torch

from .._checks import check_positive_int
from .._moved import refuses_moved
from ..errors import BatchShapeError, SequenceTooLongError
from .segmentation import MAX_BATCHED_CANDIDATES, carry_rule, segment, segment_batched, thin

__all__ = [
    "Batching",
    "as_lengths",
    "bucket_for",
    "carry_rule",
    "check_buckets",
    "check_token_budget",
    "estimate_padding",
    "plan_buckets",
    "round_up",
]


def round_up(value: int, multiple: int) -> int:
    """``value`` rounded up to a multiple of ``multiple``."""
    return -(-value // multiple) * multiple


def as_lengths(lengths: Iterable[int] | torch.Tensor) -> list[int]:
    """``lengths`` (a list, tensor, array, Series, ``datasets`` column or iterable of whole numbers)
    as a list of positive ints, or ``BatchShapeError`` naming the index and the fix."""
    if isinstance(lengths, (str, bytes)) or not isinstance(lengths, Iterable):
        raise BatchShapeError(
            "lengths must be one token length per sample (a list, array, "
            f"tensor or column), got {type(lengths).__name__} {lengths!r:.80}; "
            "e.g. [len(x['input_ids']) for x in dataset]"
        )
    shape = getattr(lengths, "shape", None)
    if shape is not None and len(shape) != 1:
        raise BatchShapeError(
            "lengths must be 1-D (one length per sample), got shape "
            f"{tuple(shape)}; for a padded batch of token ids pass its "
            "attention mask's row sums, mask.sum(dim=1)"
        )
    tolist = getattr(lengths, "tolist", None)
    values = tolist() if callable(tolist) else list(lengths)
    if not values:
        raise BatchShapeError(
            "lengths is empty: pass the token length of every sample of the "
            "dataset, e.g. [len(x['input_ids']) for x in dataset]"
        )
    return [_length(index, value) for index, value in enumerate(values)]


def _length(index: int, value: object) -> int:
    """One sample's length as a Python int: integers of any library, or a whole float."""
    if isinstance(value, bool):
        raise BatchShapeError(
            f"lengths[{index}] is {value!r}, a bool; pass token counts, e.g. len(x['input_ids'])"
        )
    if isinstance(value, float) or (
        hasattr(value, "is_integer") and not hasattr(value, "__index__")
    ):
        number = float(value)  # type: ignore[arg-type]
        if not number.is_integer():
            raise BatchShapeError(
                f"lengths[{index}] is {value!r}; a length is a whole number of "
                "tokens (a NaN or a fraction here usually means a missing or "
                "averaged value: drop or recount it)"
            )
        length = int(number)
    else:
        try:
            length = operator.index(value)  # Python, numpy and 0-d torch integers
        except TypeError:
            raise BatchShapeError(
                f"lengths[{index}] is {value!r} ({type(value).__name__}); every "
                "length must be an int, the sample's token count, e.g. "
                "len(x['input_ids'])"
            ) from None
    if length < 1:
        raise BatchShapeError(
            f"lengths[{index}] is {length}; every length must be at least 1"
            + (" (drop empty samples before planning buckets)" if length == 0 else "")
        )
    return length


def check_buckets(buckets: Sequence[int]) -> list[int]:
    """``buckets`` as a strictly ascending list of positive ints, or a clear error.

    Shared with the padder and the sampler of this folder. Numpy or torch integers are taken as
    ints.
    """
    if isinstance(buckets, (str, bytes)) or not hasattr(buckets, "__iter__"):
        raise BatchShapeError(
            f"buckets={buckets!r:.80} is not a sequence of lengths; pass the "
            "ascending padded lengths, e.g. buckets=plan_buckets(lengths)"
        )
    values = list(buckets.tolist() if hasattr(buckets, "tolist") else buckets)
    if not values:
        raise BatchShapeError("buckets is empty; pass e.g. plan_buckets(lengths)")
    for index, value in enumerate(values):
        try:
            values[index] = None if isinstance(value, bool) else operator.index(value)
        except TypeError:
            values[index] = None
        if values[index] is None or values[index] < 1:
            raise BatchShapeError(f"buckets[{index}] is {value!r}; buckets must be positive ints")
    if any(a >= b for a, b in itertools.pairwise(values)):
        raise BatchShapeError(
            f"buckets must be strictly ascending, got {values!r}; pass sorted(set(buckets))"
        )
    return values


def bucket_for(length: int, buckets: Sequence[int]) -> int:
    """The smallest bucket ``>= length``; ``-1`` when ``length`` exceeds the last bucket."""
    position = bisect.bisect_left(buckets, length)
    return buckets[position] if position < len(buckets) else -1


@dataclass(frozen=True)
class Batching:
    """How :class:`~torchcompile_kit.BucketBatchSampler` cuts each bucket into batches: what
    :func:`plan_buckets` and :func:`estimate_padding` cost the padding of.

    Args:
        batch_size: samples per batch (with ``max_tokens``: the largest batch size).
        drop_last: the sampler drops the epoch's one partial batch.
        max_tokens: a token budget: bucket ``b`` gets batches of
            ``min(batch_size, max(1, max_tokens // b))`` samples.

    Raises:
        ValueError: a ``batch_size`` or ``max_tokens`` that is not a positive int.

    Example:
        >>> Batching(64, max_tokens=4096).sizes([32, 128, 512])
        [64, 32, 8]
    """

    batch_size: int
    drop_last: bool = False
    max_tokens: int | None = None

    def __post_init__(self) -> None:
        check_positive_int("batch_size", self.batch_size, error=BatchShapeError)
        if self.max_tokens is not None:
            check_positive_int("max_tokens", self.max_tokens, error=BatchShapeError)

    def sizes(self, buckets: Sequence[int]) -> list[int]:
        """The batch size of each bucket."""
        if self.max_tokens is None:
            return [self.batch_size] * len(buckets)
        return [min(self.batch_size, max(1, self.max_tokens // b)) for b in buckets]


def check_token_budget(buckets: Sequence[int], max_tokens: int | None, *, caller: str) -> None:
    """Refuse a bucket longer than the token budget: its batches (1 sample, padded to the bucket)
    would exceed ``max_tokens`` however short their samples (shared with the sampler)."""
    if max_tokens is None or buckets[-1] <= max_tokens:
        return
    over = [b for b in buckets if b > max_tokens]
    raise BatchShapeError(
        f"{caller}: max_tokens={max_tokens} is smaller than bucket(s) {over}: a "
        f"batch of even one sample padded to {over[-1]} holds {over[-1]} "
        f"tokens, over the budget. Raise max_tokens to at least {over[-1]}, or "
        "cap the buckets at the budget: plan_buckets(lengths, "
        f"max_length={max_tokens}, ...) with "
        f"PadToBucketCollator(max_length={max_tokens}) to truncate"
    )


@refuses_moved
def estimate_padding(
    lengths: Iterable[int] | torch.Tensor,
    buckets: Sequence[int],
    *,
    batching: Batching | None = None,
    max_length: int | None = None,
) -> float:
    """The share of computed tokens that are padding, ``1 - real / computed``, for ``lengths``
    padded to ``buckets``.

    Without ``batching``, every sample is padded to its own bucket; with it, the batches are
    exactly those of a ``BucketBatchSampler`` with the same :class:`Batching` (leftovers carried
    up; a dropped partial batch's real tokens estimated from its bucket's mean). ``max_length``:
    longer lengths count as ``max_length`` (the collator truncates them). Raises
    ``SequenceTooLongError`` past the last bucket, ``ValueError`` for bad lengths, buckets or sizes.

    Example:
        >>> estimate_padding([4, 8, 8, 8], [8])
        0.125
        >>> estimate_padding([4, 8, 8, 20], [8, 24], batching=Batching(2))  # an 8 carried up
        0.375
    """
    values = as_lengths(lengths)
    bounds = check_buckets(buckets)
    if max_length is not None:
        check_positive_int("max_length", max_length, error=BatchShapeError)
        values = [min(value, max_length) for value in values]
    if max(values) > bounds[-1]:
        raise SequenceTooLongError(
            f"a length of {max(values)!r} exceeds the last bucket "
            f"{bounds[-1]!r}; pass max_length={bounds[-1]} if the collator "
            "truncates to it"
        )
    counts, sums = [0] * len(bounds), [0] * len(bounds)
    for value in values:
        position = bisect.bisect_left(bounds, value)
        counts[position] += 1
        sums[position] += value
    real = float(sum(values))
    if batching is None:
        return 1 - real / sum(c * b for c, b in zip(counts, bounds))
    computed, last_size = 0, batching.batch_size
    carry: list[list[int]] = []  # [bucket position, samples] waiting, oldest first
    for position, (count, size) in enumerate(zip(counts, batching.sizes(bounds))):
        if not count:
            continue
        full, used_carried, used = carry_rule(sum(n for _, n in carry), count, size)
        computed += full * size * bounds[position]
        _take(carry, used_carried)
        if count > used:
            carry.append([position, count - used])
        last_size = size
    while carry:  # the partial batch(es), as the sampler cuts them
        chunk = _take(carry, last_size)
        if batching.drop_last:
            real -= sum(n * sums[p] / counts[p] for p, n in chunk)
        else:
            computed += sum(n for _, n in chunk) * bounds[max(p for p, _ in chunk)]
    return 1 - real / computed if computed else 0.0


def _take(carry: list[list[int]], count: int) -> list[tuple[int, int]]:
    """Remove the ``count`` oldest samples from ``carry``; return them as (position, samples)."""
    taken = []
    while count and carry:
        n = min(count, carry[0][1])
        taken.append((carry[0][0], n))
        carry[0][1] -= n
        count -= n
        if not carry[0][1]:
            carry.pop(0)
    return taken


@refuses_moved
def plan_buckets(
    lengths: Iterable[int] | torch.Tensor,
    *,
    max_buckets: int = 8,
    multiple_of: int = 8,
    max_length: int | None = None,
    batching: Batching | None = None,
) -> list[int]:
    """Choose at most ``max_buckets`` padding lengths that minimize the padded tokens.

    An exact dynamic program over the length histogram, for batches drawn from one bucket each
    (:class:`BucketBatchSampler`); ties go to fewer buckets. Without ``batching`` the cost is per
    sample; with the sampler's :class:`Batching` it is that of the sampler's batches, leftovers
    carried up included: pass the whole dataset's lengths then.
    :func:`estimate_padding` with the same arguments gives the plan's padding.

    Args:
        lengths: token length of every sample (or of a representative sample), ``>= 1``.
        max_buckets: the most boundaries to return: each is one compiled graph.
        multiple_of: every boundary is a multiple of this (the last may equal ``max_length``).
        max_length: the longest a batch is padded to; longer samples count as ``max_length`` (the
            collator truncates them). ``None``: the longest length rounded up to ``multiple_of``.
        batching: the sampler's batch size, ``drop_last`` and token budget; ``None`` plans per
            sample.

    Returns:
        Strictly ascending boundaries; the last is ``>=`` every (truncated) length.

    Raises:
        ValueError: empty or bad lengths, a non-positive argument, or a last bucket longer than
            the batching's ``max_tokens``.

    Example:
        >>> plan_buckets([5, 6, 7, 12, 30, 31, 200], max_buckets=3, multiple_of=8)
        [8, 32, 200]
        >>> plan_buckets([5, 6, 7, 12, 30, 31, 200], max_buckets=3, batching=Batching(2))
        [16, 32, 200]
    """
    check_positive_int("max_buckets", max_buckets, error=BatchShapeError)
    check_positive_int("multiple_of", multiple_of, error=BatchShapeError)
    values = as_lengths(lengths)
    if max_length is not None:
        check_positive_int("max_length", max_length, error=BatchShapeError)
        values = [min(value, max_length) for value in values]
    top = round_up(max(values), multiple_of)
    if max_length is not None:
        top = min(top, max_length)
    if batching is not None:
        check_token_budget([top], batching.max_tokens, caller="plan_buckets")
    # A boundary is only ever worth placing at the rounded-up value of some length: moving it down
    # to that value covers the same samples with less padding. So the candidates are those values.
    per_candidate = Counter(min(round_up(value, multiple_of), top) for value in values)
    candidates = sorted(per_candidate)
    counts = [per_candidate[c] for c in candidates]
    plan = segment(candidates, counts, max_buckets)
    if batching is None:
        return plan
    sums = Counter()
    for value in values:
        sums[min(round_up(value, multiple_of), top)] += value
    if len(candidates) > MAX_BATCHED_CANDIDATES:
        candidates = thin(candidates, counts, keep=plan)
        counts = [0] * len(candidates)
        lengths_sum = [0] * len(candidates)
        for candidate, count in per_candidate.items():
            position = bisect.bisect_left(candidates, candidate)
            counts[position] += count
            lengths_sum[position] += sums[candidate]
    else:
        lengths_sum = [sums[c] for c in candidates]
    sizes = batching.sizes(candidates)
    return segment_batched(candidates, counts, lengths_sum, sizes, max_buckets, batching.drop_last)
