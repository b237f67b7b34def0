"""Choose bucket lengths: the fewest padded tokens for a bounded number of shapes.

Every new sequence length is a new graph for ``torch.compile`` (until ``recompile_limit``, 8,
silently drops the model to eager). :func:`plan_buckets` chooses at most ``max_buckets`` lengths
that waste the fewest padded tokens when batches are grouped by bucket
(:class:`~torchcompile_kit.bucket_sampler.BucketBatchSampler`); the padder and the collator in
:mod:`torchcompile_kit.buckets` pad to them.

Why the planner assumes grouped batches: with random batches of 64 almost every batch holds one long
sample, so no choice of buckets gets padding under ~80% on a long-tailed length mix (see
docs/shapes.md); grouped batches pad each sample only up to its own bucket.
"""

from __future__ import annotations

import bisect
import itertools
from collections import Counter
from collections.abc import Iterable, Sequence
from typing import Any

import torch

from .._checks import check_positive_int
from ..errors import BatchShapeError

__all__ = ["bucket_for", "check_buckets", "plan_buckets", "round_up"]


def round_up(value: int, multiple: int) -> int:
    """``value`` rounded up to a multiple of ``multiple``."""
    return -(-value // multiple) * multiple


def _as_lengths(lengths: Iterable[int] | torch.Tensor) -> list[int]:
    """``lengths`` as a list of positive Python ints, or a clear error."""
    values = lengths.tolist() if isinstance(lengths, torch.Tensor) else list(lengths)
    if not values:
        raise BatchShapeError(
            "lengths is empty: plan_buckets needs the token lengths of the dataset's samples, "
            "e.g. [len(x['input_ids']) for x in dataset]"
        )
    for index, value in enumerate(values):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise BatchShapeError(
                f"lengths[{index}] is {value!r}; every length must be a positive int "
                "(drop empty samples before planning buckets)"
            )
    return values


def check_buckets(buckets: Sequence[int]) -> list[int]:
    """``buckets`` as a strictly ascending list of positive ints, or a clear error.

    Shared with the padder and the sampler of this folder.
    """
    values = list(buckets)
    if not values:
        raise BatchShapeError("buckets is empty; pass e.g. plan_buckets(lengths)")
    for index, value in enumerate(values):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
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


def plan_buckets(
    lengths: Iterable[int] | torch.Tensor,
    *,
    max_buckets: int = 8,
    multiple_of: int = 8,
    max_length: int | None = None,
) -> list[int]:
    """Choose at most ``max_buckets`` padding lengths that minimize the padded tokens.

    The boundaries minimize the total number of tokens computed, ``sum(bucket(length))``, when every
    batch is drawn from one bucket (:class:`BucketBatchSampler`). The problem is solved exactly by a
    dynamic program over the length histogram (1-D segmentation with a convex-hull speed-up, linear
    in the number of distinct lengths per bucket), and ties go to fewer buckets, so the result is
    deterministic. Fewer than ``max_buckets`` come back when more would not save a token.

    Args:
        lengths: token length of every sample (or of a representative sample of them), ``>= 1``.
        max_buckets: the most boundaries to return: each is one compiled graph.
        multiple_of: every boundary is a multiple of this (8 suits SDPA and tensor cores; 1 allows
            any length), except that the last may equal ``max_length``.
        max_length: the longest a batch is ever padded to. Samples longer than this are *counted
            as* ``max_length`` because they are expected to be truncated to it, e.g. by
            ``PadToBucketCollator(max_length=...)``; the planner itself never drops a sample.
            ``None``: the last bucket is the longest length rounded up to ``multiple_of``.

    Returns:
        Strictly ascending boundaries; the last is ``>=`` every (truncated) length.

    Raises:
        ValueError: ``lengths`` is empty or holds a non-positive or non-int length, or an argument
            is not a positive int.

    Example:
        >>> plan_buckets([5, 6, 7, 12, 30, 31, 200], max_buckets=3, multiple_of=8)
        [8, 32, 200]
    """
    check_positive_int("max_buckets", max_buckets, error=BatchShapeError)
    check_positive_int("multiple_of", multiple_of, error=BatchShapeError)
    values = _as_lengths(lengths)
    if max_length is not None:
        check_positive_int("max_length", max_length, error=BatchShapeError)
        values = [min(value, max_length) for value in values]
    top = round_up(max(values), multiple_of)
    if max_length is not None:
        top = min(top, max_length)
    # A boundary is only ever worth placing at the rounded-up value of some length: moving it down
    # to that value covers the same samples with less padding. So the candidates are those values.
    per_candidate = Counter(min(round_up(value, multiple_of), top) for value in values)
    candidates = sorted(per_candidate)
    counts = [per_candidate[c] for c in candidates]
    return _segment(candidates, counts, max_buckets)


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
