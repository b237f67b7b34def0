"""no_recompiles with the library's own compiled pieces: the tour's loop, optimizers, HF blocks.

The tour of docs/index.md (step 3) warms up forward+backward only and runs the whole training
loop inside ``no_recompiles()``; ``compile_optimizer``'s step compiles at the optimizer's second
step, inside that block. These tests run that exact combination with a tiny Llama (aot_eager),
and check what the error says when the optimizer or a transformers block does recompile.
"""

from __future__ import annotations

import pytest
import tiny_models as tm
import torch
from torch._dynamo.testing import CompileCounterWithBackend
from torch.utils.data import DataLoader

from torchcompile_kit import (
    BucketBatchSampler,
    CompileMonitor,
    PadToBucketCollator,
    compile_optimizer,
    compile_regional,
    fix_loss_function,
    no_recompiles,
    plan_buckets,
    warmup_shapes,
)
from torchcompile_kit.diagnostics import allow_first_compile
from torchcompile_kit.errors import UnexpectedRecompileError

pytestmark = pytest.mark.filterwarnings("ignore:.*loss_type=None.*")


def _rows(lengths: list[int]) -> list[dict[str, list[int]]]:
    return [
        {"input_ids": [3 + i % 50 for i in range(n)], "labels": [3 + i % 50 for i in range(n)]}
        for n in lengths
    ]


def _dynamo_names_frames(err: pytest.ExceptionInfo) -> bool:
    """torch >= 2.9 puts the refused frame (file, function, line) in its fail_on_recompile error."""
    return "function name:" in str(err.value.__cause__)


# --------------------------------------------------------------- the tour's combination


@pytest.mark.slow
def test_tour_combination_trains_inside_no_recompiles():
    """docs/index.md step 3 as written (backend eager instead of inductor): no error, measured."""
    torch.manual_seed(0)
    model = tm.llama()
    lengths = torch.randint(4, 17, (40,)).tolist()  # two buckets: two shapes to warm up
    ds = _rows(lengths)

    def forward_backward(batch):
        loss = model(**batch).loss
        loss.backward()
        return loss

    def train(model, loader, optimizer):
        for batch in loader:
            model(**batch).loss.backward()
            optimizer.step()
            optimizer.zero_grad()

    fix_loss_function(model)
    model = compile_regional(model, backend="eager")
    optimizer = compile_optimizer(
        torch.optim.Adam(model.parameters(), lr=torch.tensor(1e-4)), backend="eager"
    )
    buckets = plan_buckets(lengths, max_buckets=8)
    sampler = BucketBatchSampler(lengths, buckets, batch_size=8)
    loader = DataLoader(ds, batch_sampler=sampler, collate_fn=PadToBucketCollator(buckets=buckets))
    one_batch_per_bucket = (
        loader.collate_fn([ds[i] for i in idx]) for idx in sampler.warmup_indices()
    )
    with CompileMonitor() as mon:
        warmup_shapes(forward_backward, one_batch_per_bucket)
        warmed = mon.snapshot()
        with no_recompiles():
            train(model, loader, optimizer)
    assert len(sampler) >= 3  # the optimizer's first compiled step is inside the block
    optimizer_counts = mon.record_for(optimizer).counts
    assert optimizer_counts.frames > 0, mon.summary()  # its step did compile
    assert optimizer_counts.recompiles == 0, mon.summary()
    # the model compiled nothing new inside the block: only the optimizer's frames were added
    assert mon.snapshot()["frames"] == warmed["frames"] + optimizer_counts.frames, mon.summary()


def test_optimizer_first_compile_is_allowed_once_then_recompiles_name_the_optimizer():
    model = torch.nn.Linear(4, 2)
    optimizer = compile_optimizer(
        torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9), backend="eager"
    )

    def step():
        model(torch.ones(3, 4)).sum().backward()
        optimizer.step()
        optimizer.zero_grad()

    with pytest.raises(UnexpectedRecompileError) as err, no_recompiles():
        step()  # eager: creates the momentum buffers
        step()  # first compiled step: allowed
        step()  # the same graph
        optimizer.param_groups[0]["momentum"] = 0.5  # a float hyperparameter changes
        step()
    message = str(err.value).split("\nDynamo said")[0]
    assert message.startswith("the SGD optimizer's step"), message
    assert "float hyperparameter" in message and "compile_optimizer" in message
    assert "warmup_shapes" not in message and "PadToBucketCollator" not in message


def test_optimizer_first_compile_under_eager_mode_compiles_once():
    model = torch.nn.Linear(4, 2)
    counter = CompileCounterWithBackend("eager")
    optimizer = compile_optimizer(torch.optim.AdamW(model.parameters(), lr=0.1), backend=counter)
    with no_recompiles(on_recompile="eager"):
        for _ in range(4):
            model(torch.ones(3, 4)).sum().backward()
            optimizer.step()
            optimizer.zero_grad()
    assert counter.frame_count > 0  # compiled at step 2 instead of running eagerly for good
    frames = counter.frame_count
    model(torch.ones(3, 4)).sum().backward()
    optimizer.step()
    assert counter.frame_count == frames  # and nothing was left to compile outside the block


def test_a_step_compiled_by_hand_gets_optimizer_advice():
    model = torch.nn.Linear(4, 2)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    step = torch.compile(optimizer.step, backend="eager")
    model(torch.ones(3, 4)).sum().backward()
    with pytest.raises(UnexpectedRecompileError) as err, no_recompiles():
        step()
    if not _dynamo_names_frames(err):
        pytest.skip("this torch's fail_on_recompile error names no frame")
    message = str(err.value).split("\nDynamo said")[0]
    assert message.startswith("an optimizer step"), message
    assert "never compiled" in message and "two optimizer steps" in message
    assert "warmup_shapes" not in message


def test_allow_first_compile_changes_nothing_outside_no_recompiles():
    counter = CompileCounterWithBackend("eager")
    double = torch.compile(lambda x: x * 2, backend=counter)
    with torch.compiler.set_stance("force_eager"), allow_first_compile() as lifted:
        double(torch.ones(2))
    assert lifted is False and counter.frame_count == 0  # the user's stance held
    with no_recompiles(), allow_first_compile() as lifted:
        double(torch.ones(2))
    assert lifted is True and counter.frame_count == 1
    with pytest.raises(UnexpectedRecompileError), no_recompiles():
        double(torch.ones(3, 3))  # outside allow_first_compile the block's stance holds


# --------------------------------------------------------------- naming transformers' modules


@pytest.mark.parametrize("how", ["regional", "whole"])
def test_hf_model_recompile_names_the_module_and_the_input(how):
    model = tm.llama()
    if how == "regional":
        compile_regional(model, backend="eager", dynamic=False)
    else:
        model.compile(backend="eager", dynamic=False)
    ids = torch.randint(3, 100, (2, 16))
    model(input_ids=ids, labels=ids).loss.backward()
    longer = torch.randint(3, 100, (2, 24))
    with pytest.raises(UnexpectedRecompileError) as err, no_recompiles():
        model(input_ids=longer, labels=longer).loss.backward()
    if not _dynamo_names_frames(err):
        pytest.skip("this torch's fail_on_recompile error names no frame")
    message = str(err.value).split("\nDynamo said")[0]
    if how == "regional":
        # transformers wraps every block's forward in forward_with_checkpointing(self, *args)
        assert message.startswith("LlamaDecoderLayer.forward ("), message
        assert "modeling_llama.py" in message
        assert "input 'hidden_states' (args[0]) has size 24 at dim 1 (compiled for 16)" in message
    else:
        assert message.startswith("LlamaForCausalLM.forward ("), message
        assert "input 'input_ids' has size 24 at dim 1 (compiled for 16)" in message
    assert "forward_with_checkpointing" not in message and "wrapper" not in message
    assert "warmup_shapes" in message  # a shape: shape advice
