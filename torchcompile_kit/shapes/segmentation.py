"""The exact segmentation behind :func:`~torchcompile_kit.plan_buckets`: dynamic programs that
choose bucket boundaries among the candidate lengths for the fewest padded tokens (per sample, and
on the sampler's batches), with a convex-hull speed-up of the per-sample one.
"""

from __future__ import annotations

import torch

__all__ = ["MAX_BATCHED_CANDIDATES", "carry_rule", "segment", "segment_batched", "thin"]

MAX_BATCHED_CANDIDATES = 384
"""The batch-aware DP is O(max_buckets * n^2 * batch_size); above this many candidate lengths the
candidates are thinned (counts merged upward, which keeps every plan valid) to bound the time."""


def carry_rule(carried: int, members: int, size: int) -> tuple[int, int, int]:
    """The sampler's rule for one bucket, on counts: ``(full_batches, carried_used, members_used)``.

    ``carried`` samples of shorter buckets wait; the bucket has ``members`` samples and batches of
    ``size``. Each full batch holds at least one member (so it pads to this bucket) and is filled
    with carried samples first; what is not used is carried up to the next bucket. Shared by
    :class:`BucketBatchSampler`, :func:`plan_buckets` and :func:`estimate_padding`, so that the
    plan and the batches follow one rule.
    """
    full = min((carried + members) // size, members)
    used_carried = min(carried, full * (size - 1))
    return full, used_carried, full * size - used_carried


def thin(candidates: list[int], counts: list[int], *, keep: list[int]) -> list[int]:
    """About ``MAX_BATCHED_CANDIDATES`` candidates, evenly spaced in sample count, plus ``keep``."""
    step = sum(counts) / MAX_BATCHED_CANDIDATES
    chosen, seen, mark = set(keep), 0, step
    for candidate, count in zip(candidates, counts):
        seen += count
        if seen >= mark:
            chosen.add(candidate)
            mark = (seen // step + 1) * step
    chosen.add(candidates[-1])
    return sorted(chosen)


def segment_batched(
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


def segment(candidates: list[int], counts: list[int], max_buckets: int) -> list[int]:
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
