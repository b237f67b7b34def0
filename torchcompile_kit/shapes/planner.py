"""Choose bucket lengths: the fewest padded tokens for a bounded number of shapes.

Every new sequence length is a new graph for ``torch.compile`` (until ``recompile_limit``, 8,
silently drops the model to eager). :func:`plan_buckets` chooses at most ``max_buckets`` lengths
that waste the fewest padded tokens when batches are grouped by bucket
(:class:`~torchcompile_kit.BucketBatchSampler`); the padder and the collator of
:mod:`.padding` pad to them, and :func:`estimate_padding` says how much padding a plan gives.

Why the planner assumes grouped batches: with random batches of 64 almost every batch holds one long
sample, so no choice of buckets gets padding under ~80% on a long-tailed length mix (see
docs/shapes.md); grouped batches pad each sample only up to its own bucket.

Why it can take the batch size: the sampler fills batches of exactly ``batch_size`` and carries a
bucket's leftovers (fewer than a batch) up into the next bucket's batches, where they pad to the
longer bucket. On the post's mix at batch 64 that adds about 1 point of padding to what a plan
made per sample promises (15.8% -> 16.9%, docs/shapes.md). Given ``batch_size``, the planner
minimizes the padding of the batches themselves (the sampler's rule, :func:`carry_rule`), and
:func:`estimate_padding` predicts it exactly (``drop_last=False``).
"""

from __future__ import annotations

import bisect
import itertools
import operator
from collections import Counter
from collections.abc import Iterable, Sequence

import torch

from .._checks import check_positive_int
from ..errors import BatchShapeError, SequenceTooLongError
from .segmentation import MAX_BATCHED_CANDIDATES, carry_rule, segment, segment_batched, thin

__all__ = [
    "as_lengths",
    "batch_sizes_for",
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
    """``lengths`` as a list of positive Python ints, or a clear error.

    Takes what users have: a list or tuple, a 1-D torch tensor or numpy array (or anything with
    ``tolist()``, e.g. a pandas Series), an HF ``datasets`` column, any iterable; the values may
    be Python, numpy or torch integers, or whole-number floats (what a pandas column becomes after
    a ``NaN`` was dropped). Shared with the sampler of this folder.

    Raises:
        BatchShapeError: empty, not one length per sample, or a value that is no whole number
            of tokens or not positive (the message names the index and the fix).
    """
    if isinstance(lengths, (str, bytes)) or not isinstance(lengths, Iterable):
        raise BatchShapeError(
            f"lengths must be one token length per sample (a list, array, tensor or column), got "
            f"{type(lengths).__name__} {lengths!r:.80}; e.g. [len(x['input_ids']) for x in dataset]"
        )
    shape = getattr(lengths, "shape", None)
    if shape is not None and len(shape) != 1:
        raise BatchShapeError(
            f"lengths must be 1-D (one length per sample), got shape {tuple(shape)}; for a padded "
            "batch of token ids pass its attention mask's row sums, mask.sum(dim=1)"
        )
    tolist = getattr(lengths, "tolist", None)
    values = tolist() if callable(tolist) else list(lengths)
    if not values:
        raise BatchShapeError(
            "lengths is empty: pass the token length of every sample of the dataset, "
            "e.g. [len(x['input_ids']) for x in dataset]"
        )
    return [_length(index, value) for index, value in enumerate(values)]


def _length(index: int, value: object) -> int:
    """One sample's length as a Python int: integers of any library, or a whole float."""
    if isinstance(value, bool):
        raise BatchShapeError(
            f"lengths[{index}] is {value!r}, a bool; pass token counts, e.g. len(x['input_ids'])"
        )
    if isinstance(value, float) or (hasattr(value, "is_integer") and not hasattr(value, "__index__")):
        number = float(value)  # type: ignore[arg-type]
        if not number.is_integer():
            raise BatchShapeError(
                f"lengths[{index}] is {value!r}; a length is a whole number of tokens (a NaN or a "
                "fraction here usually means a missing or averaged value: drop or recount it)"
            )
        length = int(number)
    else:
        try:
            length = operator.index(value)  # Python, numpy and 0-d torch integers
        except TypeError:
            raise BatchShapeError(
                f"lengths[{index}] is {value!r} ({type(value).__name__}); every length must be an "
                "int, the sample's token count, e.g. len(x['input_ids'])"
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


def batch_sizes_for(buckets: Sequence[int], batch_size: int, max_tokens: int | None) -> list[int]:
    """The batch size of each bucket: ``batch_size``, or under a token budget
    ``min(batch_size, max(1, max_tokens // bucket))`` (shared with the sampler)."""
    if max_tokens is None:
        return [batch_size] * len(buckets)
    return [min(batch_size, max(1, max_tokens // bucket)) for bucket in buckets]


def check_token_budget(buckets: Sequence[int], max_tokens: int | None, *, caller: str) -> None:
    """Refuse a bucket longer than the token budget: its batches (1 sample, padded to the bucket)
    would exceed ``max_tokens`` however short their samples (shared with the sampler)."""
    if max_tokens is None or buckets[-1] <= max_tokens:
        return
    over = [b for b in buckets if b > max_tokens]
    raise BatchShapeError(
        f"{caller}: max_tokens={max_tokens} is smaller than bucket(s) {over}: a batch of even one "
        f"sample padded to {over[-1]} holds {over[-1]} tokens, over the budget. Raise max_tokens "
        f"to at least {over[-1]}, or cap the buckets at the budget: plan_buckets(lengths, "
        f"max_length={max_tokens}, ...) with PadToBucketCollator(max_length={max_tokens}) to "
        f"truncate"
    )


def estimate_padding(
    lengths: Iterable[int] | torch.Tensor,
    buckets: Sequence[int],
    *,
    batch_size: int | None = None,
    drop_last: bool = False,
    max_tokens: int | None = None,
    max_length: int | None = None,
) -> float:
    """The share of computed tokens that are padding, for ``lengths`` padded to ``buckets``.

    Args:
        lengths: token length of every sample.
        buckets: strictly ascending padding lengths, e.g. from :func:`plan_buckets`.
        batch_size: ``None``: every sample padded to its own bucket (the per-sample figure).
            An int: the batches of ``BucketBatchSampler(lengths, buckets, batch_size, ...)``,
            leftovers carried up and the one partial batch padded to the last bucket, exactly
            as the sampler makes them (its shuffle changes which samples, not how many).
        drop_last: the sampler's ``drop_last``: the partial batch is not computed. Which samples
            it held is random, so their real tokens are estimated from the last bucket's mean.
        max_tokens: the sampler's ``max_tokens`` (per-bucket batch sizes).
        max_length: longer lengths count as ``max_length`` (the collator truncates them).

    Returns:
        Padding share in ``[0, 1)``: ``1 - real_tokens / computed_tokens``.

    Raises:
        SequenceTooLongError: a length exceeds the last bucket (pass ``max_length``).
        ValueError: empty or non-positive lengths, bad buckets or sizes.

    Example:
        >>> estimate_padding([4, 8, 8, 8], [8])
        0.125
        >>> estimate_padding([4, 8, 8, 20], [8, 24], batch_size=2)  # one 8 carried up to 24
        0.375
    """
    values = as_lengths(lengths)
    bounds = check_buckets(buckets)
    if max_length is not None:
        check_positive_int("max_length", max_length, error=BatchShapeError)
        values = [min(value, max_length) for value in values]
    if max(values) > bounds[-1]:
        raise SequenceTooLongError(
            f"a length of {max(values)!r} exceeds the last bucket {bounds[-1]!r}; pass "
            f"max_length={bounds[-1]} if the collator truncates to it"
        )
    counts, sums = [0] * len(bounds), [0] * len(bounds)
    for value in values:
        position = bisect.bisect_left(bounds, value)
        counts[position] += 1
        sums[position] += value
    real = float(sum(values))
    if batch_size is None:
        return 1 - real / sum(c * b for c, b in zip(counts, bounds))
    check_positive_int("batch_size", batch_size, error=BatchShapeError)
    if max_tokens is not None:
        check_positive_int("max_tokens", max_tokens, error=BatchShapeError)
    computed, last_size = 0, batch_size
    carry: list[list[int]] = []  # [bucket position, samples] waiting, oldest first
    for position, (count, size) in enumerate(
        zip(counts, batch_sizes_for(bounds, batch_size, max_tokens))
    ):
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
        if drop_last:
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


def plan_buckets(
    lengths: Iterable[int] | torch.Tensor,
    *,
    max_buckets: int = 8,
    multiple_of: int = 8,
    max_length: int | None = None,
    batch_size: int | None = None,
    drop_last: bool = False,
    max_tokens: int | None = None,
) -> list[int]:
    """Choose at most ``max_buckets`` padding lengths that minimize the padded tokens.

    The boundaries minimize the tokens computed when every batch is drawn from one bucket
    (:class:`BucketBatchSampler`), solved exactly by a dynamic program over the length
    histogram; ties go to fewer buckets, so the result is deterministic. Fewer than
    ``max_buckets`` come back when more would not save a token.

    Without ``batch_size`` the cost is per sample, ``sum(bucket(length))``: right when batches
    are small next to the buckets' sizes, or for a sample of the lengths. With ``batch_size``
    (and the sampler's ``drop_last``/``max_tokens``) the cost is that of the sampler's batches:
    a bucket's leftovers (fewer than a batch) are carried up and pad to the next bucket, so a
    bucket with few samples costs more than its samples alone. Pass the lengths of the whole
    dataset then, exactly those the sampler gets: the leftovers depend on the counts.
    :func:`estimate_padding` with the same arguments gives the padding of the plan.

    Args:
        lengths: token length of every sample (or of a representative sample of them), ``>= 1``.
        max_buckets: the most boundaries to return: each is one compiled graph.
        multiple_of: every boundary is a multiple of this (8 suits SDPA and tensor cores; 1 allows
            any length), except that the last may equal ``max_length``.
        max_length: the longest a batch is ever padded to. Samples longer than this are *counted
            as* ``max_length`` because they are expected to be truncated to it, e.g. by
            ``PadToBucketCollator(max_length=...)``; the planner itself never drops a sample.
            ``None``: the last bucket is the longest length rounded up to ``multiple_of``.
        batch_size: the sampler's ``batch_size``; ``None`` plans per sample.
        drop_last: the sampler's ``drop_last`` (the partial batch costs nothing but its samples
            go untrained); only with ``batch_size``.
        max_tokens: the sampler's token budget (per-bucket batch sizes); only with ``batch_size``.

    Returns:
        Strictly ascending boundaries; the last is ``>=`` every (truncated) length.

    Raises:
        ValueError: ``lengths`` is empty or holds a non-positive or non-int length, an argument
            is not a positive int, ``drop_last``/``max_tokens`` come without ``batch_size``, or
            the last bucket would be longer than ``max_tokens``.

    Example:
        >>> plan_buckets([5, 6, 7, 12, 30, 31, 200], max_buckets=3, multiple_of=8)
        [8, 32, 200]
        >>> plan_buckets([5, 6, 7, 12, 30, 31, 200], max_buckets=3, batch_size=2)
        [16, 32, 200]
    """
    check_positive_int("max_buckets", max_buckets, error=BatchShapeError)
    check_positive_int("multiple_of", multiple_of, error=BatchShapeError)
    if batch_size is None and (drop_last or max_tokens is not None):
        raise BatchShapeError(
            f"drop_last={drop_last!r}, max_tokens={max_tokens!r} describe the sampler's batches; "
            "pass its batch_size too, e.g. plan_buckets(lengths, batch_size=64, drop_last=True)"
        )
    values = as_lengths(lengths)
    if max_length is not None:
        check_positive_int("max_length", max_length, error=BatchShapeError)
        values = [min(value, max_length) for value in values]
    top = round_up(max(values), multiple_of)
    if max_length is not None:
        top = min(top, max_length)
    check_token_budget([top], max_tokens, caller="plan_buckets")
    # A boundary is only ever worth placing at the rounded-up value of some length: moving it down
    # to that value covers the same samples with less padding. So the candidates are those values.
    per_candidate = Counter(min(round_up(value, multiple_of), top) for value in values)
    candidates = sorted(per_candidate)
    counts = [per_candidate[c] for c in candidates]
    plan = segment(candidates, counts, max_buckets)
    if batch_size is None:
        return plan
    check_positive_int("batch_size", batch_size, error=BatchShapeError)
    if max_tokens is not None:
        check_positive_int("max_tokens", max_tokens, error=BatchShapeError)
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
    sizes = batch_sizes_for(candidates, batch_size, max_tokens)
    return segment_batched(candidates, counts, lengths_sum, sizes, max_buckets, drop_last)
