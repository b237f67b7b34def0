"""Choose bucket lengths: the fewest padded tokens for a bounded number of shapes.

Every new sequence length is a new graph for ``torch.compile`` (until ``recompile_limit``, 8,
silently drops the model to eager). :func:`plan_buckets` chooses at most ``max_buckets`` lengths
that waste the fewest padded tokens when batches are grouped by bucket
(:class:`~torchcompile_kit.BucketBatchSampler`); the padder and the collator of
:mod:`.padding` pad to them, and :func:`expected_padding` says how much padding a plan gives.

Why the planner assumes grouped batches: with random batches of 64 almost every batch holds one long
sample, so no choice of buckets gets padding under ~80% on a long-tailed length mix (see
docs/shapes.md); grouped batches pad each sample only up to its own bucket.

Why it can take the batch size: the sampler fills batches of exactly ``batch_size`` and carries a
bucket's leftovers (fewer than a batch) up into the next bucket's batches, where they pad to the
longer bucket. On the seed's mix at batch 64 that adds about 1 point of padding to what a plan
made per sample promises (15.8% -> 16.9%, docs/shapes.md). Given ``batch_size``, the planner
minimizes the padding of the batches themselves (the sampler's rule, :func:`carry_rule`), and
:func:`expected_padding` predicts it exactly (``drop_last=False``).
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

__all__ = [
    "as_lengths",
    "batch_sizes_for",
    "bucket_for",
    "carry_rule",
    "check_buckets",
    "check_token_budget",
    "expected_padding",
    "plan_buckets",
    "round_up",
]

# The batch-aware DP is O(max_buckets * n^2 * batch_size); above this many candidate lengths the
# candidates are thinned (counts merged upward, which keeps every plan valid) to bound the time.
_MAX_BATCHED_CANDIDATES = 384


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


def carry_rule(carried: int, members: int, size: int) -> tuple[int, int, int]:
    """The sampler's rule for one bucket, on counts: ``(full_batches, carried_used, members_used)``.

    ``carried`` samples of shorter buckets wait; the bucket has ``members`` samples and batches of
    ``size``. Each full batch holds at least one member (so it pads to this bucket) and is filled
    with carried samples first; what is not used is carried up to the next bucket. Shared by
    :class:`BucketBatchSampler`, :func:`plan_buckets` and :func:`expected_padding`, so that the
    plan and the batches follow one rule.
    """
    full = min((carried + members) // size, members)
    used_carried = min(carried, full * (size - 1))
    return full, used_carried, full * size - used_carried


def expected_padding(
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
        >>> expected_padding([4, 8, 8, 8], [8])
        0.125
        >>> expected_padding([4, 8, 8, 20], [8, 24], batch_size=2)  # one 8 carried up to 24
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
    :func:`expected_padding` with the same arguments gives the padding of the plan.

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
    plan = _segment(candidates, counts, max_buckets)
    if batch_size is None:
        return plan
    check_positive_int("batch_size", batch_size, error=BatchShapeError)
    if max_tokens is not None:
        check_positive_int("max_tokens", max_tokens, error=BatchShapeError)
    sums = Counter()
    for value in values:
        sums[min(round_up(value, multiple_of), top)] += value
    if len(candidates) > _MAX_BATCHED_CANDIDATES:
        candidates = _thin(candidates, counts, keep=plan)
        counts = [0] * len(candidates)
        lengths_sum = [0] * len(candidates)
        for candidate, count in per_candidate.items():
            position = bisect.bisect_left(candidates, candidate)
            counts[position] += count
            lengths_sum[position] += sums[candidate]
    else:
        lengths_sum = [sums[c] for c in candidates]
    sizes = batch_sizes_for(candidates, batch_size, max_tokens)
    return _segment_batched(candidates, counts, lengths_sum, sizes, max_buckets, drop_last)


def _thin(candidates: list[int], counts: list[int], *, keep: list[int]) -> list[int]:
    """About ``_MAX_BATCHED_CANDIDATES`` candidates, evenly spaced in sample count, plus ``keep``."""
    step = sum(counts) / _MAX_BATCHED_CANDIDATES
    chosen, seen, mark = set(keep), 0, step
    for candidate, count in zip(candidates, counts):
        seen += count
        if seen >= mark:
            chosen.add(candidate)
            mark = (seen // step + 1) * step
    chosen.add(candidates[-1])
    return sorted(chosen)


def _segment_batched(
    candidates: list[int],
    counts: list[int],
    lengths_sum: list[int],
    sizes: list[int],
    max_buckets: int,
    drop_last: bool,
) -> list[int]:
    """Exact DP on the sampler's batches: the state also holds how many samples are carried up.

    Positions ``1..n`` stand for ``candidates[0..n-1]``; position 0 is the start (nothing covered,
    nothing carried). ``best[p, r]`` is the least cost covering every sample up to position ``p``
    with a boundary there and ``r`` samples carried up. From ``(q, r)`` the ``m`` samples of
    ``(q, p]`` give ``carry_rule(r, m, size)``'s full batches, padded to ``candidates[p-1]``, and
    carry ``r + m - full * size`` on. At the last position the leftovers become the partial batch
    (padded to the last bucket) or, with ``drop_last``, untrained samples, charged their real
    tokens (estimated from the segment's mean), so the cost is padding + a constant. Carried
    counts stay below the largest batch size, so that bounds ``r``. Integer keys (cost, source)
    make every minimum exact and deterministic; ties keep fewer boundaries.
    """
    n, width = len(candidates), max(sizes)
    value = torch.tensor(candidates, dtype=torch.int64)
    cum = torch.cat([torch.zeros(1, dtype=torch.int64), torch.tensor(counts).cumsum(0)])
    cum_len = torch.cat([torch.zeros(1, dtype=torch.int64), torch.tensor(lengths_sum).cumsum(0)])
    size = torch.tensor(sizes, dtype=torch.int64)
    carried = torch.arange(width)
    states = (n + 1) * width
    none = torch.iinfo(torch.int64).max
    best = torch.full((n + 1, width), none, dtype=torch.int64)
    best[0, 0] = 0
    parents = []
    for _ in range(min(max_buckets, n)):
        new_best, parent = best.clone(), torch.full((n + 1, width), -1, dtype=torch.int64)
        for p in range(1, n + 1):
            members = (cum[p] - cum[:p]).unsqueeze(1)  # samples in (q, p], one row per q
            total = carried + members
            full = torch.minimum(total // size[p - 1], members)
            left = total - full * size[p - 1]
            cost = best[:p] + full * size[p - 1] * value[p - 1]
            if p == n:
                cost += left * (
                    (cum_len[p] - cum_len[:p]).unsqueeze(1) // members if drop_last else value[-1]
                )
            source = torch.arange(p).unsqueeze(1) * width + carried
            key = torch.where(best[:p] == none, none, cost * states + source)
            reached = torch.full((width,), none, dtype=torch.int64)
            reached = reached.scatter_reduce(0, left.flatten(), key.flatten(), "amin")
            better = (reached != none) & (reached // states < best[p])
            new_best[p] = torch.where(better, reached // states, best[p])
            parent[p] = torch.where(better, reached % states, -1)
        best = new_best
        parents.append(parent)
    # walk back from the cheapest end state at the forced last boundary
    boundaries = []
    p, r, layer = n, int(best[n].argmin()), len(parents) - 1
    while p > 0:
        while parents[layer][p, r] < 0:
            layer -= 1
        boundaries.append(candidates[p - 1])
        p, r = divmod(int(parents[layer][p, r]), width)
        layer -= 1
    return boundaries[::-1]


def _segment(candidates: list[int], counts: list[int], max_buckets: int) -> list[int]:
    """Exact DP: pick at most ``max_buckets`` of ``candidates`` (last one forced) to minimize cost.

    ``best[k][j]`` is the least padded-token total covering every sample up to ``candidates[j]``
    with ``k`` boundaries, the last at ``candidates[j]``::

        best[k][j] = min_i best[k-1][i] + c_j * (C_j - C_i)      (C = cumulative counts)

    For fixed ``k`` this is a minimum over lines ``y = -C_i * x + best[k-1][i]`` queried at
    ``x = c_j``: slopes fall and queries rise as ``i``/``j`` grow, so a monotone convex hull answers
    all queries in O(n) (exact integer arithmetic, no float ties).
    """
    n = len(candidates)
    cumulative = [0]
    for count in counts:
        cumulative.append(cumulative[-1] + count)
    cum = cumulative[1:]  # cum[j]: samples with (rounded) length <= candidates[j]
    layers = min(max_buckets, n)
    best = [c * s for c, s in zip(candidates, cum)]  # one boundary: everything padded to c_j
    parents: list[list[int]] = [[-1] * n]
    for _ in range(1, layers):
        new_best = list(best)  # "use fewer boundaries" stays allowed; ties keep fewer
        parent = [-2] * n  # -2: inherited from the previous layer
        hull: list[int] = []  # indices i of lines, slopes -cum[i] strictly decreasing
        head = 0
        for j in range(n):
            if j > 0:
                _hull_push(hull, j - 1, cum, best, head)
                head = min(head, len(hull) - 1)
                x = candidates[j]
                while head + 1 < len(hull) and _line(hull[head + 1], x, cum, best) <= _line(
                    hull[head], x, cum, best
                ):
                    head += 1
                i = hull[head]
                cost = best[i] + x * (cum[j] - cum[i])
                if cost < new_best[j]:
                    new_best[j], parent[j] = cost, i
        best = new_best
        parents.append(parent)
    # walk back from the forced last boundary
    boundaries = []
    j, layer = n - 1, len(parents) - 1
    while j >= 0:
        while layer > 0 and parents[layer][j] == -2:
            layer -= 1
        boundaries.append(candidates[j])
        j = parents[layer][j]
        layer -= 1
    return boundaries[::-1]


def _line(i: int, x: int, cum: list[int], best: list[int]) -> int:
    return best[i] - cum[i] * x


def _hull_push(hull: list[int], i: int, cum: list[int], best: list[int], head: int) -> None:
    """Add line ``i`` to the lower hull, dropping lines that can no longer be the minimum."""
    while len(hull) - head >= 2:
        l1, l2 = hull[-2], hull[-1]
        # slopes a = -cum: a1 > a2 > a3. l2 is useless when l1 and i cross no later than l1, l2.
        a1, a2, a3 = -cum[l1], -cum[l2], -cum[i]
        b1, b2, b3 = best[l1], best[l2], best[i]
        if (b3 - b1) * (a1 - a2) <= (b2 - b1) * (a1 - a3):
            hull.pop()
        else:
            break
    hull.append(i)
