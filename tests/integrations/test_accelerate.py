"""accelerate: prepare() with a regionally compiled model and the bucket loader, 1 and 2 processes.

Also the measured contrast with accelerate's own regional compilation (``compile_regions`` /
``TorchDynamoPlugin(use_regional_compilation=True)``) that docs/integrations.md quotes; print it
with ``python tests/integrations/test_accelerate.py``.
"""

from __future__ import annotations

import copy
import re
import shlex
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest
import tiny_models
import torch
import torch.distributed as dist
from torch._dynamo.testing import CompileCounterWithBackend

from integrations.spawn import free_port, run_on_ranks
from torchcompile_kit import (
    BucketBatchSampler,
    PadToBucketCollator,
    compile_optimizer,
    compile_regional,
    uncompile,
)
from torchcompile_kit.diagnostics import CompileMonitor
from torchcompile_kit.errors import BatchShapeError
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


@pytest.mark.slow
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


def test_unwrap_keeps_in_place_compiled_blocks_and_uncompile_undoes_them(fresh_accelerate_state):
    """accelerate's unwrap_model(keep_torch_compile=False) removes torch.compile *wrappers*
    (OptimizedModule, ``_orig_mod``); blocks compiled in place are the model itself, so they stay
    compiled (docs/integrations.md). uncompile on what it returns is the undo. When accelerate
    learns in-place compiles, the first assertion fails and the docs change with it."""
    accelerator = accelerate.Accelerator(cpu=True)
    model = accelerator.prepare(compile_regional(tiny_models.gpt2(), backend="eager"))
    unwrapped = accelerator.unwrap_model(model, keep_torch_compile=False)
    batch = tiny_models.token_batch()
    with CompileMonitor() as monitor:
        unwrapped(**batch)
    assert unwrapped is model and monitor.snapshot()["graphs"] == 2  # blocks and loss, compiled
    eager = uncompile(accelerator.unwrap_model(model, keep_torch_compile=False))
    with CompileMonitor() as monitor, torch.no_grad():  # no grad: a new graph, were it compiled
        eager(**batch)
    assert monitor.snapshot()["graphs"] == 0


def test_prepare_bucket_dataloader_refuses_double_or_wrong_sharding(fresh_accelerate_state):
    from torchcompile_kit.errors import BatchShapeError

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


def test_dispatch_batches_is_refused_not_half_read(fresh_accelerate_state):
    """dispatch_batches=True: process 0 would concatenate every process's batches (of different
    buckets) and read only its own share of the sampler; prepare_bucket_dataloader refuses it by
    name (on several processes, a loader prepared without it is refused by the sampler, which was
    not told who deals: test_bucket_sampler_shards_once_on_every_path_two_processes)."""
    from accelerate import DataLoaderConfiguration

    from torchcompile_kit.errors import BatchShapeError

    accelerator = accelerate.Accelerator(
        cpu=True, dataloader_config=DataLoaderConfiguration(dispatch_batches=True)
    )
    rows, lengths = rows_and_lengths(8)
    sampler = BucketBatchSampler(lengths, BUCKETS, batch_size=2)
    with pytest.raises(BatchShapeError, match="dispatch_batches=False"):
        prepare_bucket_dataloader(
            accelerator, rows, sampler=sampler, collate_fn=PadToBucketCollator(buckets=BUCKETS)
        )


def test_compile_optimizer_refuses_accelerated_optimizer_with_grad_scaler(fresh_accelerate_state):
    from accelerate.optimizer import AcceleratedOptimizer

    from torchcompile_kit.errors import UnsupportedOptimizerError

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
    shards = []
    for r in (0, 1):  # two processes simulated in one: each iterates epoch 0
        sampler.set_epoch(0)
        shards.append(list(BatchSamplerShard(sampler, num_processes=2, process_index=r)))
    counts = [len(shard) for shard in shards]
    samples = sorted(i for shard in shards for batch in shard for i in batch)
    if batch_size is None:
        assert counts[0] == counts[1] and samples == list(range(36))
    else:  # measured: [2, 3] batches, 18 of 36 samples
        assert counts[0] != counts[1] and len(samples) < 36


def expected_shards(lengths, epoch, world, **kwargs) -> list[list[list[int]]]:
    """Each rank's batches for ``epoch`` by the documented rule: the epoch's batch list (the same
    on every rank) topped up with its first ``(-len) % world`` batches, batch i to rank i %
    world."""
    whole = BucketBatchSampler(lengths, BUCKETS, num_replicas=1, rank=0, **kwargs)
    whole.set_epoch(epoch)
    batches = list(whole)
    batches += batches[: -len(batches) % world]
    return [batches[r::world] for r in range(world)]


def loader_batches(loader) -> list[list[int]]:
    return [batch["idx"].tolist() for batch in loader]


def check_epochs(name, rank, world, make_loader, lengths, *, resume=True, **kwargs) -> None:
    """Two epochs without a set_epoch call, then a mid-epoch resume in a fresh loader.

    Each rank's batches are exactly the documented ones (so: every sample of the epoch seen,
    only the top-up batches' samples twice, the same count on every rank), epochs differ, and
    ``skip_first_batches`` continues with exactly the batches not yet seen.
    """
    from accelerate import skip_first_batches

    loader, sampler = make_loader()
    epochs = []
    for epoch in range(2):
        got = loader_batches(loader)
        everyone = [None] * world
        dist.all_gather_object(everyone, got)
        expected = expected_shards(lengths, epoch, world, **kwargs)
        assert everyone == expected, (name, epoch, everyone, expected)
        assert len({len(part) for part in everyone}) == 1
        seen = Counter(i for part in everyone for batch in part for i in batch)
        assert set(seen) == set(range(len(lengths))), name  # every sample of the epoch
        whole = BucketBatchSampler(lengths, BUCKETS, num_replicas=1, rank=0, **kwargs)
        whole.set_epoch(epoch)
        batches = list(whole)
        top_up = batches[: -len(batches) % world]  # the documented top-up: the first batches
        assert len(top_up) == 1  # 39 batches: one repeated
        twice = sorted(i for i, count in seen.items() if count == 2)
        assert twice == sorted(top_up[0]) and max(seen.values()) == 2, name
        assert sampler.epoch == epoch, (name, sampler.epoch)
        epochs.append(got)
    assert epochs[0] != epochs[1], name
    if not resume:
        return
    # resume epoch 1 after 3 batches, as a restarted process would: a fresh sampler and loader
    loader, sampler = make_loader()
    loader.set_epoch(1)
    rest = loader_batches(skip_first_batches(loader, 3))
    assert rest == epochs[1][3:], (name, rank, rest, epochs[1])


def accelerate_body(rank: int, world: int) -> None:
    kwargs = {"batch_size": 16, "max_tokens": 128}  # sizes 16, 8, 4
    rows, lengths = rows_and_lengths(205)  # 39 batches
    collate = PadToBucketCollator(buckets=BUCKETS)
    early = BucketBatchSampler(lengths, BUCKETS, **kwargs)  # before torch.distributed exists
    accelerator = accelerate.Accelerator(cpu=True)  # initializes the process group from the env
    assert accelerator.num_processes == world and dist.is_initialized()
    assert early.num_replicas == world and early.batch_size is None  # resolved when used
    model = compile_regional(tiny_models.gpt2(), backend="aot_eager")
    prepared = accelerator.prepare(model)
    assert accelerator.unwrap_model(prepared) is model
    whole = BucketBatchSampler(lengths, BUCKETS, num_replicas=1, rank=0, **kwargs)
    assert len(whole) % world == 1  # odd: the top-up repeats one batch

    def plain(sampler_kwargs=None, *, told=True):
        def make():
            sampler = BucketBatchSampler(lengths, BUCKETS, **kwargs, **(sampler_kwargs or {}))
            loader = accelerator.prepare(
                torch.utils.data.DataLoader(rows, batch_sampler=sampler, collate_fn=collate)
            )
            if told:  # the user says accelerate deals (prepare_bucket_dataloader says it itself)
                sampler.deal_with_accelerate(accelerator.num_processes)
            assert len(loader) == (len(whole) + 1) // world
            return loader, sampler

        return make

    def helper():
        sampler = BucketBatchSampler(lengths, BUCKETS, **kwargs)
        return prepare_bucket_dataloader(
            accelerator, rows, sampler=sampler, collate_fn=collate
        ), sampler

    # DDP by hand: a plain DataLoader, the sampler deals (told so: an Accelerator exists)
    def by_hand():
        sampler = BucketBatchSampler(lengths, BUCKETS, num_replicas=world, rank=rank, **kwargs)
        loader = torch.utils.data.DataLoader(rows, batch_sampler=sampler, collate_fn=collate)
        return loader, sampler

    # plain accelerator.prepare, the sampler not told who deals: refused, nothing silently dropped
    sampler = BucketBatchSampler(lengths, BUCKETS, **kwargs)
    untold = accelerator.prepare(
        torch.utils.data.DataLoader(rows, batch_sampler=sampler, collate_fn=collate)
    )
    with pytest.raises(BatchShapeError, match="deal_with_accelerate"):
        next(iter(untold))
    check_epochs("accelerator.prepare", rank, world, plain(), lengths, **kwargs)
    check_epochs(
        "accelerate deals (num_replicas=1)",
        rank,
        world,
        plain({"num_replicas": 1, "rank": 0}),
        lengths,
        resume=False,
        **kwargs,
    )
    check_epochs("prepare_bucket_dataloader", rank, world, helper, lengths, **kwargs)
    check_epochs("DDP by hand", rank, world, by_hand, lengths, resume=False, **kwargs)
    # DDP by hand resumes with set_epoch and by skipping the batches already trained on
    loader, sampler = by_hand()
    first = [loader_batches(loader) for _ in range(2)]
    sampler = BucketBatchSampler(lengths, BUCKETS, num_replicas=world, rank=rank, **kwargs)
    sampler.set_epoch(1)
    assert list(sampler)[3:] == first[1][3:]

    # a DDP step per batch: would hang if the ranks' batch counts differed
    loader, _ = plain()()
    for batch in loader:
        batch.pop("idx")
        accelerator.backward(prepared(**batch).loss)

    # a sampler built for another number of processes is refused, not silently double-dealt
    with pytest.raises(BatchShapeError, match="num_replicas=4"):
        BucketBatchSampler(lengths, BUCKETS, num_replicas=4, rank=rank, **kwargs)


@pytest.mark.slow
@pytest.mark.distributed
def test_bucket_sampler_shards_once_on_every_path_two_processes():
    """plain accelerator.prepare, prepare_bucket_dataloader, accelerate dealing, DDP by hand."""
    run_on_ranks(accelerate_body, init_process_group=False)


LAUNCH = re.compile(r"^# (?P<command>accelerate launch .+\.py)\s*$", re.MULTILINE)


@pytest.mark.distributed
@pytest.mark.slow
def test_docs_accelerate_launch_command_starts_two_cpu_processes(tmp_path):
    """The `# accelerate launch ...` example of docs/integrations.md, run with that command."""
    page = (Path(__file__).resolve().parents[2] / "docs" / "integrations.md").read_text()
    block = next(b for b in re.findall(r"```python\n(.*?)```", page, re.DOTALL) if LAUNCH.match(b))
    argv = shlex.split(LAUNCH.match(block)["command"])
    (tmp_path / argv[-1]).write_text(block)
    launcher = str(Path(sys.executable).parent / "accelerate")
    command = [launcher, "launch", "--main_process_port", str(free_port()), *argv[2:]]
    result = subprocess.run(
        command, cwd=tmp_path, capture_output=True, text=True, timeout=600, check=False
    )
    assert result.returncode == 0, result.stderr[-6000:]
    lines = sorted(line for line in result.stdout.splitlines() if line.startswith("process "))
    assert [line.split(":")[0] for line in lines] == ["process 0 of 2", "process 1 of 2"], (
        result.stdout
    )
    assert len({line.split(":")[1] for line in lines}) == 1  # the same batch count


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


@pytest.mark.slow
def test_contrast_with_accelerate_regional_compilation():
    figures = measure_regional_contrast()
    ours = figures["torchcompile_kit.compile_regional"]
    theirs = figures["accelerate use_regional_compilation"]
    assert ours["same object"] and ours["_orig_mod keys"].startswith("0/")
    # one graph for the blocks, one for the loss (compile_regional's compile_loss=True)
    assert (ours["graphs"], ours["recompiles"], ours["graph_breaks"]) == (2, 0, 0)
    assert not theirs["same object"] and not theirs["_orig_mod keys"].startswith("0/")


if __name__ == "__main__":
    for variant, values in measure_regional_contrast().items():
        print(f"{variant}: {values}")
