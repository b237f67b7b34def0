"""plan_buckets, pad_to_bucket, PadToBucketCollator and BucketBatchSampler."""

from __future__ import annotations

import bisect
import itertools
import random

import pytest
import tiny_models
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch._dynamo.testing import CompileCounterWithBackend

from torchcompile_kit import (
    Batching,
    BucketBatchSampler,
    PadToBucketCollator,
    no_recompiles,
    pad_to_bucket,
    plan_buckets,
    warmup_shapes,
)
from torchcompile_kit.bench import caption_length_mix as caption_lengths
from torchcompile_kit.errors import SequenceTooLongError
from torchcompile_kit.shapes import estimate_padding

PROPERTY = settings(max_examples=60, deadline=None)


def padded_tokens(lengths: list[int], buckets: list[int]) -> int:
    """Tokens computed when each sample is padded to the smallest bucket holding it."""
    return sum(min(b for b in buckets if b >= n) for n in lengths)


def brute_force_cost(lengths: list[int], k: int, multiple_of: int, max_length: int | None) -> int:
    """Least padded tokens over every valid choice of at most k boundaries (exhaustive)."""
    clipped = [min(n, max_length) if max_length else n for n in lengths]
    top = -(-max(clipped) // multiple_of) * multiple_of
    if max_length is not None:
        top = min(top, max_length)
    inner = [c for c in range(multiple_of, top, multiple_of)]
    best = None
    for size in range(k):
        for chosen in itertools.combinations(inner, size):
            cost = padded_tokens(clipped, [*chosen, top])
            best = cost if best is None else min(best, cost)
    return best


# ---------------------------------------------------------------- plan_buckets


@PROPERTY
@given(
    lengths=st.lists(st.integers(1, 40), min_size=1, max_size=25),
    k=st.integers(1, 4),
    multiple_of=st.sampled_from([1, 2, 4, 8]),
    max_length=st.none() | st.integers(1, 48),
)
def test_planner_is_optimal_against_brute_force(lengths, k, multiple_of, max_length):
    buckets = plan_buckets(lengths, max_buckets=k, multiple_of=multiple_of, max_length=max_length)
    clipped = [min(n, max_length) if max_length else n for n in lengths]
    assert 1 <= len(buckets) <= k
    assert buckets == sorted(set(buckets))
    assert buckets[-1] >= max(clipped)
    if max_length is not None:
        assert buckets[-1] <= max_length
    for b in buckets[:-1]:
        assert b % multiple_of == 0
    assert buckets[-1] % multiple_of == 0 or buckets[-1] == max_length
    assert padded_tokens(clipped, buckets) == brute_force_cost(lengths, k, multiple_of, max_length)


def test_planner_is_deterministic_and_order_free():
    lengths = caption_lengths(3000)
    shuffled = random.Random(1).sample(lengths, len(lengths))
    first = plan_buckets(lengths)
    assert plan_buckets(shuffled) == first == plan_buckets(torch.tensor(lengths))


def test_planner_degenerate_inputs():
    assert plan_buckets([13]) == [16]
    assert plan_buckets([13], multiple_of=1) == [13]
    assert plan_buckets([20] * 50, max_buckets=8) == [24]
    # more buckets than distinct lengths: no useless boundaries
    assert plan_buckets([3, 9], max_buckets=8, multiple_of=1) == [3, 9]
    # the last may equal max_length even when it is not a multiple of multiple_of
    assert plan_buckets([5, 300], max_length=100) == [8, 100]


@pytest.mark.parametrize(
    "lengths, match",
    [([], "empty"), ([3, 0, 4], r"lengths\[1\] is 0"), ([3, -2], r"-2"), ([2.5], r"2\.5")],
)
def test_planner_rejects_bad_lengths(lengths, match):
    with pytest.raises(ValueError, match=match):
        plan_buckets(lengths)


def test_planner_rejects_bad_arguments():
    with pytest.raises(ValueError, match="max_buckets"):
        plan_buckets([4], max_buckets=0)
    with pytest.raises(ValueError, match="multiple_of"):
        plan_buckets([4], multiple_of=0)


def test_planner_on_the_seed_mix_meets_the_reference_padding():
    # reference (notes §4, analytic): grouped batches, K=8 waste 14.0% (any length) / 15.9%
    # (multiples of 8); K=4 26.4%; multiple-of-32 grouped 39.1%
    lengths = caption_lengths(20000)
    real = sum(lengths)

    def waste(buckets):
        return 1 - real / padded_tokens(lengths, buckets)

    assert waste(plan_buckets(lengths, max_buckets=8, multiple_of=1, max_length=256)) < 0.15
    assert waste(plan_buckets(lengths, max_buckets=8, max_length=256)) < 0.17
    assert waste(plan_buckets(lengths, max_buckets=4, multiple_of=1, max_length=256)) < 0.28
    assert waste(list(range(32, 257, 32))) > 0.37


# ---------------------------------------------------------------- pad_to_bucket


@PROPERTY
@given(
    seqs=st.lists(st.lists(st.integers(1, 99), min_size=0, max_size=30), min_size=1, max_size=6),
    extra=st.lists(st.integers(1, 40), min_size=0, max_size=3),
    side=st.sampled_from(["right", "left"]),
    as_tensor=st.booleans(),
)
def test_pad_to_bucket_pads_to_the_smallest_fitting_bucket(seqs, extra, side, as_tensor):
    longest = max(len(s) for s in seqs)
    buckets = sorted({max(longest, 1), *extra})
    inputs = [torch.tensor(s, dtype=torch.long) for s in seqs] if as_tensor else seqs
    out = pad_to_bucket(inputs, buckets, pad_value=-7, padding_side=side)
    expected_len = min(b for b in buckets if b >= longest)
    assert out.shape == (len(seqs), expected_len)
    for row, seq in zip(out.tolist(), seqs):
        pad = [-7] * (expected_len - len(seq))
        assert row == (seq + pad if side == "right" else pad + seq)


def test_pad_to_bucket_errors():
    with pytest.raises(SequenceTooLongError, match=r"sequences\[1\] has length 9"):
        pad_to_bucket([[1], list(range(9))], [4, 8])
    with pytest.raises(ValueError, match="ascending"):
        pad_to_bucket([[1]], [8, 4])
    with pytest.raises(ValueError, match="1-D"):
        pad_to_bucket([torch.ones(2, 2)], [8])
    with pytest.raises(ValueError, match="padding_side"):
        pad_to_bucket([[1]], [8], padding_side="middle")
    with pytest.raises(ValueError, match="empty"):
        pad_to_bucket([], [8])


# ---------------------------------------------------------------- PadToBucketCollator


@PROPERTY
@given(
    lens=st.lists(st.integers(1, 40), min_size=1, max_size=6),
    buckets=st.lists(st.integers(1, 48), min_size=1, max_size=4).map(lambda b: sorted({*b, 48})),
    side=st.sampled_from(["right", "left"]),
    with_mask=st.booleans(),
)
def test_collator_pads_every_key_to_a_bucket(lens, buckets, side, with_mask):
    rng = random.Random(sum(lens))
    features = []
    for n in lens:
        ids = [rng.randint(3, 99) for _ in range(n)]
        feature = {"input_ids": ids, "labels": list(ids)}
        if with_mask:
            feature["attention_mask"] = [1] * n
        features.append(feature)
    collate = PadToBucketCollator(buckets=buckets, pad_token_id=0, padding_side=side)
    batch = collate(features)
    length = batch["input_ids"].shape[1]
    assert length in buckets and length == min(b for b in buckets if b >= max(lens))
    for key in ("input_ids", "labels", "attention_mask"):
        assert batch[key].shape == (len(lens), length)
    for row, feature in enumerate(features):
        n = len(feature["input_ids"])
        real = slice(0, n) if side == "right" else slice(length - n, length)
        pad = slice(n, length) if side == "right" else slice(0, length - n)
        assert batch["input_ids"][row, real].tolist() == feature["input_ids"]
        assert batch["labels"][row, real].tolist() == feature["labels"]
        assert (batch["labels"][row, pad] == -100).all()
        assert (batch["input_ids"][row, pad] == 0).all()
        mask = batch["attention_mask"][row]
        assert mask.sum().item() == n and (mask[real] == 1).all()


def test_collator_without_buckets_pads_to_a_multiple():
    batch = PadToBucketCollator(multiple_of=8)([{"input_ids": [1] * 9}, {"input_ids": [2] * 3}])
    assert batch["input_ids"].shape == (2, 16)
    capped = PadToBucketCollator(multiple_of=8, max_length=12)
    assert capped([{"input_ids": [1] * 11}])["input_ids"].shape == (1, 12)


def test_collator_truncates_to_max_length_keeping_keys_aligned():
    collate = PadToBucketCollator(buckets=[4, 8], max_length=8)
    batch = collate([{"input_ids": list(range(1, 12)), "labels": list(range(101, 112))}])
    assert batch["input_ids"].tolist() == [list(range(1, 9))]
    assert batch["labels"].tolist() == [list(range(101, 109))]


def test_collator_passes_other_keys_through():
    features = [
        {
            "pixel_values": torch.full((3, 4, 4), float(i)),
            "labels": [5, 6, i + 1],
            "decoder_input_ids": [1, 5, 6],
            "label": i,
            "caption": f"c{i}",
        }
        for i in range(3)
    ]
    batch = PadToBucketCollator(buckets=[8])(features)
    assert batch["pixel_values"].shape == (3, 3, 4, 4)
    assert batch["pixel_values"][2, 0, 0, 0].item() == 2.0
    assert batch["label"].tolist() == [0, 1, 2]
    assert batch["caption"] == ["c0", "c1", "c2"]
    assert batch["labels"].shape == batch["decoder_input_ids"].shape == (3, 8)
    assert "attention_mask" not in batch  # only built for input_ids


def test_collator_pads_left_with_the_pad_id_given():
    collate = PadToBucketCollator(buckets=[4], pad_token_id=9, padding_side="left")
    batch = collate([{"input_ids": [1, 2]}])
    assert batch["input_ids"].tolist() == [[9, 9, 1, 2]]
    assert batch["attention_mask"].tolist() == [[0, 0, 1, 1]]


def test_collator_errors_name_the_key_and_index():
    collate = PadToBucketCollator(buckets=[4, 8])
    with pytest.raises(SequenceTooLongError, match=r"features\[1\]\['input_ids'\] has length 9"):
        collate([{"input_ids": [1]}, {"input_ids": [1] * 9}])
    with pytest.raises(ValueError, match=r"features\[1\]\['attention_mask'\] has length 2"):
        collate(
            [
                {"input_ids": [1], "attention_mask": [1]},
                {"input_ids": [1, 2, 3], "attention_mask": [1, 1]},
            ]
        )
    with pytest.raises(ValueError, match=r"features\[1\].*missing \['labels'\]"):
        collate([{"input_ids": [1], "labels": [1]}, {"input_ids": [1]}])
    with pytest.raises(ValueError, match=r"features\[0\]\['input_ids'\] must be 1-D"):
        collate([{"input_ids": [[1, 2], [3, 4]]}])
    with pytest.raises(ValueError, match=r"features\[1\]\['pixel_values'\] has shape"):
        collate(
            [
                {"input_ids": [1], "pixel_values": torch.ones(3)},
                {"input_ids": [1], "pixel_values": torch.ones(4)},
            ]
        )
    with pytest.raises(ValueError, match="pad_token_id=None.*tokenizer.pad_token = "):
        PadToBucketCollator(pad_token_id=None)
    with pytest.raises(ValueError, match="max_length=9 exceeds the last bucket"):
        PadToBucketCollator(buckets=[4, 8], max_length=9)


# ---------------------------------------------------------------- BucketBatchSampler


def bucket_of(length: int, buckets: list[int]) -> int:
    return buckets[bisect.bisect_left(buckets, length)]


@PROPERTY
@given(
    lengths=st.lists(st.integers(1, 40), min_size=1, max_size=80),
    k=st.integers(1, 4),
    batch_size=st.integers(1, 9),
    drop_last=st.booleans(),
    seed=st.integers(0, 3),
    epoch=st.integers(0, 3),
)
def test_sampler_batches_are_single_bucket_and_cover_every_index(
    lengths, k, batch_size, drop_last, seed, epoch
):
    buckets = plan_buckets(lengths, max_buckets=k, multiple_of=4)
    sampler = BucketBatchSampler(lengths, buckets, batch_size, drop_last=drop_last, seed=seed)
    sampler.set_epoch(epoch)
    batches = list(sampler)
    assert len(batches) == len(sampler)
    flat = [i for b in batches for i in b]
    assert len(flat) == len(set(flat))
    if not drop_last:
        assert sorted(flat) == list(range(len(lengths)))
    else:
        assert len(lengths) - len(flat) < batch_size
    shapes = set(sampler.batch_shapes())
    assert len(shapes) <= len(buckets) + (0 if drop_last else 1)
    partial = [b for b in batches if len(b) != batch_size]
    assert len(partial) <= (0 if drop_last else 1)
    for batch in batches:
        bucket = bucket_of(max(lengths[i] for i in batch), buckets)
        assert all(lengths[i] <= bucket for i in batch)
        assert (len(batch), bucket) in shapes
    # warm-up batches have exactly the listed shapes
    warm = sampler.warmup_indices()
    assert [(len(b), bucket_of(max(lengths[i] for i in b), buckets)) for b in warm] == list(
        sampler.batch_shapes()
    )
    # reproducible for (seed, epoch)
    again = BucketBatchSampler(lengths, buckets, batch_size, drop_last=drop_last, seed=seed)
    again.set_epoch(epoch)
    assert list(again) == batches


def test_sampler_shuffles_within_and_across_buckets_per_epoch():
    lengths = caption_lengths(2000)
    buckets = plan_buckets(lengths, max_buckets=4)
    sampler = BucketBatchSampler(lengths, buckets, 16, seed=3)
    epoch0 = list(sampler)
    sampler.set_epoch(1)
    epoch1 = list(sampler)
    assert epoch0 != epoch1
    assert sorted(map(sorted, epoch0)) != sorted(map(sorted, epoch1))  # different groupings too
    order = [bucket_of(max(lengths[i] for i in b), buckets) for b in epoch0]
    assert order != sorted(order)  # buckets interleaved, not shortest-first
    unshuffled = [
        bucket_of(max(lengths[i] for i in b), buckets)
        for b in BucketBatchSampler(lengths, buckets, 16, seed=None)
    ]
    assert unshuffled == sorted(unshuffled)
    assert list(BucketBatchSampler(lengths, buckets, 16, seed=4)) != epoch0
    with pytest.raises(ValueError, match=r"seed=False: pass an int .* or None \(no shuffle\)"):
        BucketBatchSampler(lengths, buckets, 16, seed=False)  # the old shuffle=False


@PROPERTY
@given(
    n=st.integers(1, 120),
    world=st.integers(1, 4),
    batch_size=st.integers(1, 8),
    drop_last=st.booleans(),
)
def test_sampler_ddp_shards(n, world, batch_size, drop_last):
    lengths = caption_lengths(n, seed=n)
    buckets = plan_buckets(lengths, max_buckets=3, max_length=256)
    shards = [
        list(
            BucketBatchSampler(
                lengths,
                buckets,
                batch_size,
                drop_last=drop_last,
                seed=7,
                num_replicas=world,
                rank=r,
            )
        )
        for r in range(world)
    ]
    single = list(BucketBatchSampler(lengths, buckets, batch_size, drop_last=drop_last, seed=7))
    assert len({len(s) for s in shards}) == 1  # every rank the same number of batches
    per_rank = [[i for b in shard for i in b] for shard in shards]
    if drop_last:
        flat = [i for rank in per_rank for i in rank]
        assert len(flat) == len(set(flat))  # disjoint
    else:
        assert set().union(*map(set, per_rank)) == set(range(n))  # every index somewhere
        extra = sum(len(s) for s in shards) - len(single)
        assert 0 <= extra < world  # only the top-up repeats
        if len(single) % world == 0:
            flat = [i for rank in per_rank for i in rank]
            assert len(flat) == len(set(flat))


def test_sampler_reads_world_size_from_torch_distributed(tmp_path):
    if not torch.distributed.is_available():
        pytest.skip("torch.distributed not built")
    torch.distributed.init_process_group(
        "gloo", init_method=f"file://{tmp_path}/store", rank=0, world_size=1
    )
    try:
        sampler = BucketBatchSampler([3, 4, 5], [8], 1)
        assert (sampler.num_replicas, sampler.rank) == (1, 0)
    finally:
        torch.distributed.destroy_process_group()
    with pytest.raises(ValueError, match="rank must be"):
        BucketBatchSampler([3], [8], 1, num_replicas=2, rank=2)


def test_sampler_token_budget_keeps_batch_tokens_near_constant():
    lengths = caption_lengths(3000)
    buckets = plan_buckets(lengths, max_buckets=4, max_length=256)
    sampler = BucketBatchSampler(lengths, buckets, 512, max_tokens=2048)
    for size, bucket in zip(sampler.batch_sizes, buckets):
        assert size * bucket <= 2048 and (size + 1) * bucket > 2048
    shapes = sampler.batch_shapes()
    assert len(shapes) <= len(buckets) + 1
    for batch in sampler:
        bucket = bucket_of(max(lengths[i] for i in batch), buckets)
        assert len(batch) * bucket <= 2048


def test_sampler_errors():
    with pytest.raises(SequenceTooLongError, match=r"lengths\[1\] is 40.*min\(length, 32\)"):
        BucketBatchSampler([4, 40], [8, 32], 2)
    with pytest.raises(ValueError, match=r"lengths\[0\] is 0"):
        BucketBatchSampler([0], [8], 2)
    with pytest.raises(ValueError, match="batch_size"):
        BucketBatchSampler([4], [8], 0)
    with pytest.raises(ValueError, match="empty"):
        BucketBatchSampler([], [8], 2)


def test_sampler_and_collator_drive_a_dataloader():
    lengths = caption_lengths(500)
    rng = random.Random(0)
    dataset = [{"input_ids": [rng.randint(3, 99) for _ in range(n)]} for n in lengths]
    for row in dataset:
        row["labels"] = list(row["input_ids"])
    buckets = plan_buckets(lengths, max_buckets=4, max_length=256)
    sampler = BucketBatchSampler(lengths, buckets, 32)
    loader = torch.utils.data.DataLoader(
        dataset, batch_sampler=sampler, collate_fn=PadToBucketCollator(buckets=buckets)
    )
    seen = set()
    tokens = 0
    for batch in loader:
        seen.add(tuple(batch["input_ids"].shape))
        tokens += int(batch["attention_mask"].sum())
    assert seen <= set(sampler.batch_shapes())
    assert tokens == sum(lengths)


# ---------------------------------------------------------------- plans that know the batch


def sampler_tokens(lengths, buckets, batch_size, *, drop_last=False, max_tokens=None):
    """(computed, real) tokens of the batches BucketBatchSampler really yields."""
    sampler = BucketBatchSampler(
        lengths, buckets, batch_size, drop_last=drop_last, max_tokens=max_tokens, seed=5
    )
    computed = real = 0
    for batch in sampler:
        computed += len(batch) * bucket_of(max(lengths[i] for i in batch), buckets)
        real += sum(lengths[i] for i in batch)
    return computed, real


@PROPERTY
@given(
    lengths=st.lists(st.integers(1, 40), min_size=1, max_size=60),
    k=st.integers(1, 4),
    batch_size=st.integers(1, 7),
    max_tokens=st.none() | st.integers(40, 160),  # >= every bucket: lengths <= 40, multiple_of 4
)
def test_expected_padding_is_what_the_sampler_batches_give(lengths, k, batch_size, max_tokens):
    buckets = plan_buckets(lengths, max_buckets=k, multiple_of=4)
    computed, real = sampler_tokens(lengths, buckets, batch_size, max_tokens=max_tokens)
    predicted = estimate_padding(
        lengths, buckets, batching=Batching(batch_size, max_tokens=max_tokens)
    )
    assert predicted == pytest.approx(1 - real / computed, abs=1e-12)


@pytest.mark.slow
@PROPERTY
@given(
    lengths=st.lists(st.integers(1, 40), min_size=1, max_size=40),
    k=st.integers(1, 4),
    batch_size=st.integers(1, 6),
    multiple_of=st.sampled_from([1, 4, 8]),
)
def test_batch_aware_plan_is_optimal_for_the_sampler_batches(lengths, k, batch_size, multiple_of):
    buckets = plan_buckets(
        lengths, max_buckets=k, multiple_of=multiple_of, batching=Batching(batch_size)
    )
    assert 1 <= len(buckets) <= k and buckets == sorted(set(buckets))
    assert buckets[-1] >= max(lengths)
    top = -(-max(lengths) // multiple_of) * multiple_of
    inner = range(multiple_of, top, multiple_of)
    least = min(
        sampler_tokens(lengths, [*chosen, top], batch_size)[0]
        for size in range(k)
        for chosen in itertools.combinations(inner, size)
    )
    assert sampler_tokens(lengths, buckets, batch_size)[0] == least


def test_batch_size_one_plans_as_per_sample():
    lengths = caption_lengths(3000, seed=2)
    for k in (2, 5, 8):
        assert plan_buckets(lengths, max_buckets=k, batching=Batching(1)) == plan_buckets(
            lengths, max_buckets=k
        )


def test_seed_mix_batches_pad_as_planned():
    """Issue 13: at batch 64, multiple_of=8, the batches' padding is the plan's (±0.5 pt)."""
    lengths = caption_lengths(19200)  # the shapes bench's epoch: 300 batches of 64
    per_sample = plan_buckets(lengths, max_buckets=8, max_length=256)
    aware = plan_buckets(
        lengths, max_buckets=8, max_length=256, batching=Batching(64, drop_last=True)
    )
    planned = estimate_padding(lengths, aware, batching=Batching(64, drop_last=True))
    rng = random.Random(0)
    dataset = [{"input_ids": [rng.randint(3, 99) for _ in range(n)]} for n in lengths]
    loader = torch.utils.data.DataLoader(
        dataset,
        batch_sampler=BucketBatchSampler(lengths, aware, 64, drop_last=True, seed=0),
        collate_fn=PadToBucketCollator(buckets=aware),
    )
    real = computed = 0
    for batch in loader:
        real += int(batch["attention_mask"].sum())
        computed += batch["attention_mask"].numel()
    assert abs((1 - real / computed) - planned) < 0.005
    # and no worse than the per-sample plan once both are cut into the same batches
    assert planned <= estimate_padding(lengths, per_sample, batching=Batching(64, drop_last=True))
    assert len(aware) <= 8 and all(b % 8 == 0 for b in aware)


def test_many_candidate_lengths_are_thinned_but_never_worse_than_per_sample():
    rng = random.Random(3)
    lengths = [rng.randint(1, 900) for _ in range(4000)]  # ~900 distinct candidates
    per_sample = plan_buckets(lengths, multiple_of=1)
    aware = plan_buckets(lengths, multiple_of=1, batching=Batching(32))
    assert len(aware) <= 8 and aware[-1] == max(lengths)
    assert estimate_padding(lengths, aware, batching=Batching(32)) <= estimate_padding(
        lengths, per_sample, batching=Batching(32)
    )


def test_a_bucket_longer_than_max_tokens_is_refused():
    """It used to yield batches of 1 sample padded to 256 under a budget of 128 tokens."""
    lengths = [5, 6, 7, 200, 9, 250]
    with pytest.raises(
        ValueError,
        match=r"max_tokens=128 is smaller than bucket\(s\) \[256\]"
        r".*at least 256.*max_length=128",
    ):
        BucketBatchSampler(lengths, [16, 256], 8, max_tokens=128)
    with pytest.raises(ValueError, match="plan_buckets: max_tokens=128 is smaller"):
        plan_buckets(lengths, batching=Batching(8, max_tokens=128))
    buckets = plan_buckets(lengths, max_length=128, batching=Batching(8, max_tokens=128))
    sampler = BucketBatchSampler([min(n, 128) for n in lengths], buckets, 8, max_tokens=128)
    assert all(len(b) * buckets[-1] <= 128 or len(b) * 16 <= 128 for b in sampler)


def test_batch_options_errors():
    with pytest.raises(ValueError, match="batch_size"):
        Batching(0)
    with pytest.raises(ValueError, match="max_tokens"):
        Batching(8, max_tokens=0)
    with pytest.raises(SequenceTooLongError, match="max_length=8"):
        estimate_padding([4, 9], [8])
    assert estimate_padding([4, 9], [8], max_length=8) == pytest.approx(1 - 12 / 16)


# ---------------------------------------------------------------- end to end with a tiny GPT-2


@pytest.mark.slow
def test_training_over_the_seed_mix_compiles_one_graph_set_per_bucket():
    """Collator + sampler + warmup_shapes: at most len(buckets) shapes, 0 recompiles."""
    torch.manual_seed(0)
    max_length = 128  # the tiny GPT-2 has 128 positions: longer samples are truncated
    lengths = caption_lengths(400, seed=1)
    rng = random.Random(1)
    dataset = [{"input_ids": [rng.randint(3, 127) for _ in range(n)]} for n in lengths]
    for row in dataset:
        row["labels"] = list(row["input_ids"])
    buckets = plan_buckets(lengths, max_buckets=4, max_length=max_length)
    clipped = [min(n, max_length) for n in lengths]
    sampler = BucketBatchSampler(clipped, buckets, 8, drop_last=True, seed=0)
    collate = PadToBucketCollator(buckets=buckets, max_length=max_length)

    model = tiny_models.gpt2(n_layer=1, use_cache=False)
    counter = CompileCounterWithBackend("aot_eager")
    model.compile(backend=counter, dynamic=False)
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-2)

    def forward_backward(batch):
        loss = model(**batch).loss
        loss.backward()
        return loss

    warm = [collate([dataset[i] for i in idx]) for idx in sampler.warmup_indices()]
    forward_backward(warm[0])
    frames_per_shape = counter.frame_count
    shapes = warmup_shapes(forward_backward, warm)
    model.zero_grad(set_to_none=True)
    assert len(shapes) <= len(buckets)
    after_warmup = counter.frame_count
    assert after_warmup <= len(buckets) * frames_per_shape

    loader = torch.utils.data.DataLoader(dataset, batch_sampler=sampler, collate_fn=collate)
    seen, losses = set(), []
    with no_recompiles():
        for step, batch in enumerate(loader):
            if step == 10:
                break
            seen.add(tuple(batch["input_ids"].shape))
            losses.append(forward_backward(batch).item())
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
    assert counter.frame_count == after_warmup  # 0 recompiles
    assert len(seen) >= 2 and len(seen) <= len(buckets)
    assert all(torch.isfinite(torch.tensor(losses)))


def test_sampler_advances_its_epoch_unless_set_epoch_was_called():
    lengths = caption_lengths(300)
    buckets = plan_buckets(lengths, max_buckets=3, max_length=256)
    sampler = BucketBatchSampler(lengths, buckets, 8, seed=2)
    epochs = [list(sampler) for _ in range(3)]  # no set_epoch: 0, 1, 2
    for epoch, batches in enumerate(epochs):
        pinned = BucketBatchSampler(lengths, buckets, 8, seed=2)
        pinned.set_epoch(epoch)
        assert list(pinned) == batches
    assert epochs[0] != epochs[1] != epochs[2]
    sampler.set_epoch(1)
    assert list(sampler) == epochs[1] and sampler.epoch == 1
    sampler.sampler.set_epoch(0)  # accelerate's DataLoaderShard.set_epoch path
    assert list(sampler) == epochs[0]


def test_sampler_deals_once_inside_accelerates_batch_sampler_shard():
    data_loader = pytest.importorskip("accelerate.data_loader")
    lengths = caption_lengths(205)
    buckets = plan_buckets(lengths, max_buckets=3, max_length=256)
    sampler = BucketBatchSampler(lengths, buckets, 16, max_tokens=512, seed=1)
    sampler.deal_with_accelerate(2)  # what prepare_bucket_dataloader says after accelerator.prepare
    shards = [
        data_loader.BatchSamplerShard(sampler, num_processes=2, process_index=r) for r in (0, 1)
    ]
    got = []
    for shard in shards:
        sampler.set_epoch(0)
        got.append(list(shard))
    own = [
        BucketBatchSampler(lengths, buckets, 16, max_tokens=512, seed=1, num_replicas=2, rank=r)
        for r in (0, 1)
    ]
    assert got == [list(s) for s in own]  # the same batches as the sampler dealing itself
    assert [len(s) for s in shards] == [len(s) for s in own]
    assert sorted({i for part in got for b in part for i in b}) == list(range(205))
    wrong = BucketBatchSampler(lengths, buckets, 16, num_replicas=4, rank=0)
    wrong.deal_with_accelerate(2)
    with pytest.raises(ValueError, match="num_replicas=4"):
        len(data_loader.BatchSamplerShard(wrong, num_processes=2, process_index=0))
