"""accelerate: prepare() with a regionally compiled model and the bucket loader, 1 and 2 processes.

Also the measured contrast with accelerate's own regional compilation (``compile_regions`` /
``TorchDynamoPlugin(use_regional_compilation=True)``) that docs/integrations.md quotes; print it
with ``python tests/integrations/test_accelerate.py``.
"""

from __future__ import annotations

import copy

import pytest
import tiny_models
import torch
import torch.distributed as dist
from torch._dynamo.testing import CompileCounterWithBackend

from integrations.spawn import run_on_ranks
from torchcompile_kit import (
    BucketBatchSampler,
    PadToBucketCollator,
    compile_optimizer,
    compile_regional,
)
from torchcompile_kit.diagnostics import CompileMonitor
from torchcompile_kit.integrations import prepare_bucket_dataloader

accelerate = pytest.importorskip("accelerate")

BUCKETS = [8, 16, 32]


def rows_and_lengths(n: int, seed: int = 0) -> tuple[list[dict], list[int]]:
    gen = torch.Generator().manual_seed(seed)
    lengths = torch.randint(4, 31, (n,), generator=gen).tolist()
    rows = [
        {"input_ids": list(range(3, 3 + k)), "labels": list(range(3, 3 + k)), "idx": i}
        for i, k in enumerate(lengths)
    ]
    return rows, lengths


@pytest.fixture
def fresh_accelerate_state():
    from accelerate.state import AcceleratorState, GradientState

    yield
    AcceleratorState._reset_state(True)
    GradientState._reset_state()


def test_accelerate_one_process_trains_saves_and_loads(tmp_path, fresh_accelerate_state):
    accelerator = accelerate.Accelerator(cpu=True)
    counter = CompileCounterWithBackend("aot_eager")
    model = compile_regional(tiny_models.gpt2(), backend=counter)
    # SGD: its compiled step traces in a fraction of AdamW's time (AdamW is tested in tests/optim)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    prepared, optimizer = accelerator.prepare(model, optimizer)
    assert prepared is model  # regional compile is in place: accelerate keeps the object
    assert compile_optimizer(optimizer, backend="eager") is optimizer  # unwrapped, compiled
    assert hasattr(optimizer.optimizer.step, "_torchcompile_kit_impl")

    rows, lengths = rows_and_lengths(20)
    sampler = BucketBatchSampler(lengths, BUCKETS, batch_size=4, max_tokens=64)
    assert sampler.batch_size is None  # sizes vary: accelerate must not trust a batch size
    loader = prepare_bucket_dataloader(
        accelerator, rows, sampler=sampler, collate_fn=PadToBucketCollator(buckets=BUCKETS)
    )
    orders = []
    for _ in range(2):
        seen = []
        for batch in loader:
            seen.extend(batch.pop("idx").tolist())
            accelerator.backward(prepared(**batch).loss)
            optimizer.step(), optimizer.zero_grad()
        assert sorted(seen) == list(range(len(rows)))  # each sample exactly once per epoch
        orders.append(seen)
    assert orders[0] != orders[1] and sampler.epoch == 1  # accelerate's set_epoch reached it
    frames = counter.frame_count

    accelerator.save_state(str(tmp_path))
    saved = copy.deepcopy(model.state_dict())
    saved_opt = copy.deepcopy(optimizer.state_dict())
    batch = next(iter(loader))
    batch.pop("idx")
    accelerator.backward(prepared(**batch).loss)
    optimizer.step(), optimizer.zero_grad()
    accelerator.load_state(str(tmp_path))
    for name, value in model.state_dict().items():
        torch.testing.assert_close(value, saved[name], rtol=0, atol=0, msg=name)
    assert optimizer.state_dict()["param_groups"] == saved_opt["param_groups"]
    assert counter.frame_count == frames  # the extra step and the round trip compiled nothing
    keys = accelerator.get_state_dict(prepared)
    assert not [k for k in keys if "_orig_mod" in k]


def test_prepare_bucket_dataloader_refuses_double_or_wrong_sharding(fresh_accelerate_state):
    from torchcompile_kit import BatchShapeError

    accelerator = accelerate.Accelerator(cpu=True)
    rows, lengths = rows_and_lengths(8)
    collate = PadToBucketCollator(buckets=BUCKETS)
    wrong = BucketBatchSampler(lengths, BUCKETS, batch_size=2, num_replicas=2, rank=0)
    with pytest.raises(BatchShapeError, match="num_replicas=2"):
        prepare_bucket_dataloader(accelerator, rows, sampler=wrong, collate_fn=collate)
    sampler = BucketBatchSampler(lengths, BUCKETS, batch_size=2)
    with pytest.raises(BatchShapeError, match="shuffle"):
        prepare_bucket_dataloader(
            accelerator, rows, sampler=sampler, collate_fn=collate, shuffle=True
        )


def test_compile_optimizer_refuses_accelerated_optimizer_with_grad_scaler(fresh_accelerate_state):
    from accelerate.optimizer import AcceleratedOptimizer

    from torchcompile_kit import UnsupportedOptimizerError

    accelerate.Accelerator(cpu=True)  # AcceleratedOptimizer reads the accelerator's state
    inner = torch.optim.SGD(torch.nn.Linear(2, 2).parameters(), lr=0.1)
    wrapped = AcceleratedOptimizer(
        inner, device_placement=False, scaler=torch.amp.GradScaler("cpu")
    )
    with pytest.raises(UnsupportedOptimizerError, match=r"before accelerator\.prepare"):
        compile_optimizer(wrapped, backend="eager")


@pytest.mark.parametrize("batch_size", [4, None])
def test_batch_sampler_shard_trusts_batch_size(batch_size):
    """Why a varying sampler says batch_size=None: accelerate's BatchSamplerShard, 2 processes."""
    from accelerate.data_loader import BatchSamplerShard

    _, lengths = rows_and_lengths(36)
    sampler = BucketBatchSampler(
        lengths, BUCKETS, batch_size=4, max_tokens=64, num_replicas=1, rank=0
    )
    assert sampler.batch_size is None
    sampler.batch_size = batch_size  # 4: what it said before, the largest batch size
    shards = [list(BatchSamplerShard(sampler, num_processes=2, process_index=r)) for r in (0, 1)]
    counts = [len(shard) for shard in shards]
    samples = sorted(i for shard in shards for batch in shard for i in batch)
    if batch_size is None:
        assert counts[0] == counts[1] and samples == list(range(36))
    else:  # measured: [2, 3] batches, 18 of 36 samples
        assert counts[0] != counts[1] and len(samples) < 36


def accelerate_body(rank: int, world: int) -> None:
    accelerator = accelerate.Accelerator(cpu=True)  # initializes the process group from the env
    assert accelerator.num_processes == world and dist.is_initialized()
    model = compile_regional(tiny_models.gpt2(), backend="aot_eager")
    prepared = accelerator.prepare(model)
    assert accelerator.unwrap_model(prepared) is model
    rows, lengths = rows_and_lengths(36)
    collate = PadToBucketCollator(buckets=BUCKETS)
    whole = BucketBatchSampler(
        lengths, BUCKETS, batch_size=4, max_tokens=64, num_replicas=1, rank=0
    )
    assert len(whole) % world == 0  # so "exactly once" holds (else a top-up repeats a batch)

    for who in ("sampler", "accelerate"):
        if who == "sampler":
            sampler = BucketBatchSampler(lengths, BUCKETS, batch_size=4, max_tokens=64)
            assert sampler.num_replicas == world  # read from torch.distributed
        else:
            sampler = BucketBatchSampler(
                lengths, BUCKETS, batch_size=4, max_tokens=64, num_replicas=1, rank=0
            )
        loader = prepare_bucket_dataloader(accelerator, rows, sampler=sampler, collate_fn=collate)
        for epoch in range(2):
            seen, batches = [], 0
            for batch in loader:
                seen.extend(batch.pop("idx").tolist())
                batches += 1
                if epoch == 0 and batches <= 2:  # a DDP step: would hang on unequal counts
                    accelerator.backward(prepared(**batch).loss)
            everyone = [None] * world
            dist.all_gather_object(everyone, (batches, seen))
            assert len({count for count, _ in everyone}) == 1, (who, everyone)
            flat = sorted(i for _, part in everyone for i in part)
            assert flat == list(range(len(rows))), (who, epoch, flat)
            assert sampler.epoch == epoch


@pytest.mark.distributed
def test_accelerate_two_processes_each_sample_once_equal_batches():
    run_on_ranks(accelerate_body, init_process_group=False)


def measure_regional_contrast(steps: int = 6) -> dict[str, dict[str, object]]:
    """compile_regional vs accelerate's regional compilation on one tiny GPT-2, same batches."""
    from accelerate.state import AcceleratorState, GradientState
    from accelerate.utils import TorchDynamoPlugin

    figures: dict[str, dict[str, object]] = {}
    for name in ("torchcompile_kit.compile_regional", "accelerate use_regional_compilation"):
        torch._dynamo.reset()
        torch.manual_seed(0)
        model = tiny_models.gpt2()
        with CompileMonitor() as monitor:
            if name.startswith("torchcompile_kit"):
                compiled = accelerate.Accelerator(cpu=True).prepare(
                    compile_regional(model, backend="aot_eager")
                )
            else:
                plugin = TorchDynamoPlugin(backend="aot_eager", use_regional_compilation=True)
                compiled = accelerate.Accelerator(cpu=True, dynamo_plugin=plugin).prepare(model)
            for step in range(steps):
                compiled(**tiny_models.token_batch(2, 16, seed=step)).loss.backward()
        snap = monitor.snapshot()
        keys = list(compiled.state_dict())
        figures[name] = {
            "frames": snap["frames"],
            "graphs": snap["graphs"],
            "recompiles": snap["recompiles"],
            "graph_breaks": snap["graph_breaks"],
            "_orig_mod keys": f"{sum('_orig_mod' in k for k in keys)}/{len(keys)}",
            "same object": compiled is model,
        }
        AcceleratorState._reset_state(True)
        GradientState._reset_state()
    return figures


def test_contrast_with_accelerate_regional_compilation():
    figures = measure_regional_contrast()
    ours = figures["torchcompile_kit.compile_regional"]
    theirs = figures["accelerate use_regional_compilation"]
    assert ours["same object"] and ours["_orig_mod keys"].startswith("0/")
    assert (ours["graphs"], ours["recompiles"], ours["graph_breaks"]) == (1, 0, 0)
    assert not theirs["same object"] and not theirs["_orig_mod keys"].startswith("0/")


if __name__ == "__main__":
    for variant, values in measure_regional_contrast().items():
        print(f"{variant}: {values}")
