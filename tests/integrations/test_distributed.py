"""DDP and FSDP2 on 2 gloo ranks, activation checkpointing + bf16 autocast,
discovery after FSDP2."""

from __future__ import annotations

import copy
import math

import pytest
import tiny_models
import torch
import torch.distributed as dist
from torch import nn
from torch._dynamo.testing import CompileCounterWithBackend

from integrations.spawn import run_on_ranks
from torchcompile_kit import (
    BucketBatchSampler,
    PadToBucketCollator,
    compile_regional,
    get_regional_plan,
    uncompile,
    warmup_shapes,
)
from torchcompile_kit.integrations import apply_fsdp2_regional, enable_activation_checkpointing
from torchcompile_kit.regional import find_repeated_blocks

pytest.importorskip("transformers")

STEPS = 3
FP32 = {"rtol": 1e-4, "atol": 1e-5}


def global_batch(step: int) -> dict[str, torch.Tensor]:
    return tiny_models.token_batch(4, 16, seed=step)


def local_rows(batch: dict[str, torch.Tensor], rank: int, world: int) -> dict[str, torch.Tensor]:
    per_rank = batch["input_ids"].shape[0] // world
    return {k: v[rank * per_rank : (rank + 1) * per_rank] for k, v in batch.items()}


def mean_over_ranks(value: torch.Tensor) -> torch.Tensor:
    value = value.detach().clone()
    dist.all_reduce(value)
    return value / dist.get_world_size()


def full(t: torch.Tensor) -> torch.Tensor:
    return t.full_tensor() if hasattr(t, "full_tensor") else t


def train_against_reference(rank, world, model, forward, ref) -> None:
    """STEPS SGD steps on the local rows vs eager ``ref`` on the global batch: loss, grads and
    weights."""
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    ref_opt = torch.optim.SGD(ref.parameters(), lr=0.1)
    for step in range(STEPS):
        batch = global_batch(step)
        loss = forward(**local_rows(batch, rank, world)).loss
        loss.backward()
        ref_loss = ref(**batch).loss
        ref_loss.backward()
        # equal token counts per rank: the mean of the ranks' means is the global mean
        torch.testing.assert_close(mean_over_ranks(loss), ref_loss.detach(), **FP32)
        for (name, p), q in zip(model.named_parameters(), ref.parameters()):
            torch.testing.assert_close(full(p.grad), q.grad, **FP32, msg=f"step {step} {name}")
        opt.step(), ref_opt.step(), opt.zero_grad(), ref_opt.zero_grad()
    for (name, p), q in zip(model.named_parameters(), ref.parameters()):
        torch.testing.assert_close(full(p.detach()), q.detach(), **FP32, msg=name)


def bucket_epoch_without_recompiles(rank, world, forward, counter) -> None:
    """The bucket sampler shards by itself: equal batch counts, and after warm-up 0 recompiles."""
    gen = torch.Generator().manual_seed(0)
    lengths = torch.randint(4, 31, (20,), generator=gen).tolist()
    rows = [{"input_ids": list(range(3, 3 + n)), "labels": list(range(3, 3 + n))} for n in lengths]
    buckets = [16, 32]  # batch sizes 4 and 2 (max_tokens): few shapes, each a compile
    sampler = BucketBatchSampler(lengths, buckets, batch_size=4, max_tokens=64)  # world from dist
    assert (sampler.num_replicas, sampler.rank) == (world, rank)
    counts = [None] * world
    dist.all_gather_object(counts, len(sampler))
    assert len(set(counts)) == 1, counts
    collate = PadToBucketCollator(buckets=buckets)

    def step(batch):
        forward(**batch).loss.backward()

    # every rank warms up every shape (a rank may meet any of them), in the same order
    warmup_shapes(step, (collate([rows[i] for i in idx]) for idx in sampler.warmup_indices()))
    frames = counter.frame_count
    seen = []
    for idx in sampler:
        step(collate([rows[i] for i in idx]))
        seen.extend(idx)
    assert counter.frame_count == frames, "recompiled after warm-up"
    everyone = [None] * world
    dist.all_gather_object(everyone, seen)
    flat = sorted(i for part in everyone for i in part)
    assert set(flat) == set(range(len(rows)))  # every sample; a top-up may repeat a batch


def ddp_and_fsdp2_body(rank: int, world: int) -> None:
    from torch.distributed.fsdp import FSDPModule
    from torch.nn.parallel import DistributedDataParallel as DDP

    # DDP: blocks compiled in place, then wrapped
    torch.manual_seed(0)
    ref = tiny_models.gpt2()
    counter = CompileCounterWithBackend("aot_eager")
    model = compile_regional(copy.deepcopy(ref), backend=counter, compile_loss=False)
    ddp = DDP(model)
    train_against_reference(rank, world, model, ddp, ref)
    assert counter.frame_count == 1  # one graph serves both blocks, all steps
    assert list(model.state_dict()) == list(ref.state_dict())  # clean keys, no _orig_mod
    bucket_epoch_without_recompiles(rank, world, ddp, counter)

    # FSDP2 in torchtitan's order: checkpointing -> compile -> fully_shard per block, then root
    torch.manual_seed(1)
    ref = tiny_models.gpt2()
    counter = CompileCounterWithBackend("aot_eager")
    model = apply_fsdp2_regional(
        copy.deepcopy(ref),
        checkpointing=True,
        compile_kwargs={"backend": counter, "compile_loss": False},  # the blocks' graphs
    )
    blocks = [model.get_submodule(name) for name in find_repeated_blocks(model).blocks]
    assert [type(b).__name__ for b in blocks] == ["FSDPGPT2Block"] * 2
    assert all(isinstance(b, FSDPModule) for b in blocks) and isinstance(model, FSDPModule)
    train_against_reference(rank, world, model, model, ref)
    assert counter.frame_count == 1
    keys = list(model.state_dict())
    assert keys == list(ref.state_dict()), [
        k for k in keys if "_orig_mod" in k or "_checkpoint" in k
    ]


@pytest.mark.distributed
def test_ddp_and_fsdp2_match_eager_on_two_ranks():
    run_on_ranks(ddp_and_fsdp2_body)


def background_body(rank: int, world: int, cwd: str) -> None:
    """compile_in_background under DDP: rank 0's worker compiles, every rank switches
    at the same call (no rank waits in a collective for another), then trains compiled; a rank
    slower to load at the switch still finds the worker's files (rank 0 removed them under it)."""
    import os
    import time

    from torch.nn.parallel import DistributedDataParallel as DDP

    from torchcompile_kit.regional import background, compile_in_background, get_background_compile

    os.chdir(cwd)
    if rank == 1:  # the slower rank at the switch: rank 0 must not remove the worker's files first
        load = background.load_with_keys
        background.load_with_keys = lambda *args, **kwargs: (
            time.sleep(1.0),
            load(*args, **kwargs),
        )[1]
    torch.manual_seed(0)
    ref = tiny_models.gpt2()
    model = compile_in_background(copy.deepcopy(ref))
    ddp = DDP(model)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    step, started = 0, time.perf_counter()
    while get_background_compile(model).stall_s is None:  # the same answer on every rank
        batch = local_rows(global_batch(step % 4), rank, world)
        ddp(**batch).loss.backward()
        opt.step(), opt.zero_grad()
        step += 1
        time.sleep(0.01)
        assert time.perf_counter() - started < 300, "no switch in 300 s"
    record = get_background_compile(model)
    calls = [None] * world
    dist.all_gather_object(
        calls,
        (record.state.value, record.switched_at_call, record.eager_steps, record.worker_check),
    )
    assert calls[0] == calls[1] and calls[0][0] == "compiled" and calls[0][3] == "passed", calls
    assert (record._proc is not None) == (rank == 0)  # one worker for the job
    group = get_regional_plan(model).groups[0]
    assert group.precompile_path == "precompiled (no trace)", group.precompile_path
    losses = []
    for _ in range(2):  # compiled steps, in step on both ranks
        loss = ddp(**local_rows(global_batch(0), rank, world)).loss
        loss.backward(), opt.step(), opt.zero_grad()
        losses.append(mean_over_ranks(loss).item())
    assert all(math.isfinite(x) for x in losses)


@pytest.mark.slow
@pytest.mark.distributed
def test_a_background_compile_switches_every_rank_at_the_same_call(tmp_path):
    pytest.importorskip("transformers")
    run_on_ranks(background_body, str(tmp_path))


def gpu_short_body(rank: int, world: int, cwd: str) -> None:
    """Rank 0 alone decides not to start the worker (the training GPU is short of memory): every
    rank gives up at the same call and trains on eagerly under DDP. Before, rank 0 gave up alone
    and rank 1 waited for rank 0's worker status in a collective that never came."""
    import faulthandler
    import os

    from torch.nn.parallel import DistributedDataParallel as DDP

    from torchcompile_kit.errors import CompileCacheWarning
    from torchcompile_kit.regional import (
        BackgroundCompile,
        BackgroundState,
        background,
        compile_in_background,
        get_background_compile,
    )

    faulthandler.dump_traceback_later(60, exit=True)  # a rank stuck in a collective fails
    os.chdir(cwd)
    if rank == 0:  # the memory check runs where the worker would start: rank 0
        background._gpu_memory_short = lambda options: "the GPU is short of memory (stood in)"
    torch.manual_seed(0)
    model = compile_in_background(tiny_models.gpt2(), worker=BackgroundCompile(start_after_s=0))
    ddp = DDP(model)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with pytest.warns(CompileCacheWarning, match="short of memory"):
        ddp(**local_rows(global_batch(0), rank, world)).loss.backward()
    opt.step(), opt.zero_grad()
    for step in range(1, 3):  # eager DDP steps, in step on both ranks
        ddp(**local_rows(global_batch(step), rank, world)).loss.backward()
        opt.step(), opt.zero_grad()
    record = get_background_compile(model)
    seen = [None] * world
    dist.all_gather_object(seen, (record.state, record.eager_reason, record.eager_steps))
    assert seen[0] == seen[1], seen
    assert seen[0][0] is BackgroundState.EAGER and seen[0][2] == 1, seen
    assert "short of memory" in seen[0][1], seen
    faulthandler.cancel_dump_traceback_later()


@pytest.mark.distributed
def test_a_background_worker_refused_on_rank_0_leaves_every_rank_eager_at_the_same_call(tmp_path):
    run_on_ranks(gpu_short_body, str(tmp_path))


def rank_0_eval_body(rank: int, world: int, cwd: str) -> None:
    """Evaluation on rank 0 alone between DDP training steps, as many training loops do: its
    calls take no part in the background compile's status exchange, which only calls every rank
    makes (those in the first call's mode) share. Before, each of rank 0's evaluation calls
    broadcast a status that rank 1 never asked for, and the ranks' collectives went out of step."""
    import faulthandler
    import os

    from torch.nn.parallel import DistributedDataParallel as DDP

    from torchcompile_kit.regional import (
        BackgroundCompile,
        BackgroundState,
        compile_in_background,
        get_background_compile,
    )

    faulthandler.dump_traceback_later(60, exit=True)  # a rank stuck in a collective fails
    os.chdir(cwd)
    torch.manual_seed(0)
    # the worker starts after 10 minutes: the status is asked at every call until then
    model = compile_in_background(tiny_models.gpt2(), worker=BackgroundCompile(start_after_s=600))
    ddp = DDP(model)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    losses = []
    for step in range(3):
        loss = ddp(**local_rows(global_batch(step), rank, world)).loss
        loss.backward(), opt.step(), opt.zero_grad()
        losses.append(mean_over_ranks(loss).item())
        if rank == 0:
            model.eval()
            with torch.no_grad():
                model(**global_batch(step))
            model.train()
    record = get_background_compile(model)
    seen = [None] * world
    dist.all_gather_object(seen, (record.state, record.eager_steps))
    assert seen == [(BackgroundState.COMPILING, 3)] * world, seen
    assert all(math.isfinite(x) for x in losses)
    uncompile(model)  # no worker started; rank 0 removes the folder
    faulthandler.cancel_dump_traceback_later()


@pytest.mark.distributed
def test_evaluation_on_rank_0_alone_keeps_the_background_compile_in_step(tmp_path):
    run_on_ranks(rank_0_eval_body, str(tmp_path))


def test_discovery_finds_fsdp_renamed_blocks_outside_containers():
    """``_no_split_modules`` names GPT2Block; fully_shard makes it FSDPGPT2Block (a subclass)."""
    model = tiny_models.gpt2()
    blocks = list(model.transformer.h)
    renamed = type("FSDPGPT2Block", (type(blocks[0]),), {})
    del model.transformer.h
    for i, block in enumerate(blocks):
        block.__class__ = renamed
        model.transformer.add_module(f"block{i}", block)
    assert find_repeated_blocks(model).blocks == ["transformer.block0", "transformer.block1"]


def test_checkpointing_and_bf16_autocast_match_eager_without_recompiles():
    ref = tiny_models.gpt2()
    counter = CompileCounterWithBackend("aot_eager")
    model = copy.deepcopy(ref)
    enable_activation_checkpointing(model)
    assert all(block.gradient_checkpointing for block in model.transformer.h)
    compile_regional(model, backend=counter, compile_loss=False)  # the blocks' graphs
    frames = []
    for step in range(3):
        batch = global_batch(step)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            loss = model(**batch).loss
            ref_loss = ref(**batch).loss
        loss.backward(), ref_loss.backward()
        torch.testing.assert_close(loss.float(), ref_loss.float(), rtol=2e-2, atol=2e-2)
        for (name, p), q in zip(model.named_parameters(), ref.parameters()):
            torch.testing.assert_close(p.grad, q.grad, rtol=5e-2, atol=5e-3, msg=name)
        model.zero_grad(), ref.zero_grad()
        frames.append(counter.frame_count)
    assert frames == [1, 1, 1]
    uncompile(model)
    assert not any(block.gradient_checkpointing for block in model.transformer.h)


class _Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(16, 16)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + torch.tanh(self.lin(x))


def test_generic_checkpointing_shares_one_graph_and_keeps_keys():
    ref = nn.Sequential(_Block(), _Block(), _Block())
    model = copy.deepcopy(ref)
    assert enable_activation_checkpointing(model) == ["0", "1", "2"]
    counter = CompileCounterWithBackend("aot_eager")
    compile_regional(model, backend=counter)
    x = torch.randn(4, 16, requires_grad=True)  # as every block's input: no requires_grad guard
    for _ in range(2):
        model(x).sum().backward()
    ref(x).sum().backward(), ref(x).sum().backward()
    for (name, p), q in zip(model.named_parameters(), ref.parameters()):
        torch.testing.assert_close(p.grad, q.grad, **FP32, msg=name)
    assert counter.frame_count == 1
    assert list(model.state_dict()) == list(ref.state_dict())
    uncompile(model)
    assert "forward" not in model[0].__dict__
