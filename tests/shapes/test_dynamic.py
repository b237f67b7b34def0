"""mark_dynamic_batch, warmup_shapes and no_recompiles, counted with CompileCounter."""

from __future__ import annotations

import warnings

import pytest
import tiny_models
import torch
from torch._dynamo.testing import CompileCounter, CompileCounterWithBackend

from torchcompile_kit import mark_dynamic_batch, no_recompiles, warmup_shapes
from torchcompile_kit.errors import UnexpectedRecompileError


def _summed(batch):
    return sum(t.float().sum() for t in batch.values())


def _batch(batch: int, length: int) -> dict[str, torch.Tensor]:
    return tiny_models.token_batch(batch, length)


# ---------------------------------------------------------------- mark_dynamic_batch


def test_marking_every_tensor_gives_one_graph_across_lengths():
    counter = CompileCounter()
    step = torch.compile(_summed, backend=counter)
    step(mark_dynamic_batch(_batch(4, 8)))
    for length in (5, 17, 40, 9):
        step(_batch(4, length))  # later batches need no marks
    assert counter.frame_count == 1


def test_marking_only_input_ids_still_recompiles():
    """The trap the helper exists for: an unmarked labels tensor carries the same length."""
    counter = CompileCounter()
    step = torch.compile(_summed, backend=counter)
    first = _batch(4, 8)
    torch._dynamo.mark_dynamic(first["input_ids"], 1)
    step(first)
    step(_batch(4, 12))
    assert counter.frame_count == 2


def test_tiny_gpt2_trains_over_lengths_with_one_graph_set():
    model = tiny_models.gpt2(n_layer=1, use_cache=False)
    counter = CompileCounterWithBackend("aot_eager")
    model.compile(backend=counter)
    model(**mark_dynamic_batch(_batch(4, 16), 1, min=2, max=128)).loss.backward()
    frames = counter.frame_count
    for length in (9, 33, 24):
        model(**_batch(4, length)).loss.backward()
    assert counter.frame_count == frames


@pytest.mark.slow
@pytest.mark.parametrize(
    "bounds", [{"max": 256}, {"min": 4}, {}], ids=["max only", "min only", "none"]
)
def test_one_bound_alone_works_on_a_transformers_model(bounds):
    """docs/shapes.md's `mark_dynamic_batch(first, 1, max=256)`: torch asserts ("not simple sympy
    type None") when only one of min/max reaches it; the helper fills the other in."""
    torch._dynamo.reset()
    model = tiny_models.llama(n_layer=1)
    counter = CompileCounterWithBackend("aot_eager")
    model.compile(backend=counter)
    model(**mark_dynamic_batch(_batch(2, 16), 1, **bounds)).loss.backward()
    frames = counter.frame_count
    for length in (9, 24):
        model(**_batch(2, length)).loss.backward()
    assert counter.frame_count == frames


def test_size_one_dims_are_left_unmarked_with_a_warning():
    counter = CompileCounter()
    step = torch.compile(_summed, backend=counter)
    with pytest.warns(UserWarning, match=r"'input_ids'\] \(size 1 at dim 0\).*'labels'\] \(size 1"):
        step(mark_dynamic_batch(_batch(1, 8), 0))
    step(_batch(3, 8))  # batch 1 was specialized: the next size compiles again
    assert counter.frame_count == 2
    # marked at a size >= 2, a later batch size reuses the graph
    torch._dynamo.reset()
    counter = CompileCounter()
    step = torch.compile(_summed, backend=counter)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        step(mark_dynamic_batch(_batch(2, 8), 0))
    step(_batch(5, 8))
    assert counter.frame_count == 1


def test_min_and_max_are_checked_before_dynamo_sees_them():
    with pytest.raises(ValueError, match="min=1"):
        mark_dynamic_batch(_batch(2, 8), 1, min=1)
    with pytest.raises(ValueError, match=r"'labels'\] has size 40 at dim 1, outside"):
        mark_dynamic_batch({"labels": torch.ones(2, 40)}, 1, max=32)
    with pytest.raises(ValueError, match="larger than max"):
        mark_dynamic_batch(_batch(2, 8), 1, min=16, max=8)


def test_keys_limit_what_is_marked():
    counter = CompileCounter()
    step = torch.compile(_summed, backend=counter)
    batch = {"input_ids": torch.ones(2, 8), "pixel_values": torch.ones(2, 3, 4)}
    step(mark_dynamic_batch(batch, 1, keys=("input_ids",)))
    step({"input_ids": torch.ones(2, 11), "pixel_values": torch.ones(2, 3, 4)})
    assert counter.frame_count == 1  # ids dynamic
    step({"input_ids": torch.ones(2, 11), "pixel_values": torch.ones(2, 5, 4)})
    assert counter.frame_count == 2  # channels stayed static
    with pytest.raises(ValueError, match=r"\['nope'\] are not in the batch"):
        mark_dynamic_batch(batch, keys=("nope",))
    with pytest.raises(ValueError, match="needs a mapping batch"):
        mark_dynamic_batch([torch.ones(2, 3)], keys=("x",))


def test_lists_and_tensors_are_marked_too():
    counter = CompileCounter()
    step = torch.compile(lambda xs: xs[0].sum() + xs[1].sum(), backend=counter)
    step(mark_dynamic_batch([torch.ones(2, 8), torch.ones(2, 8, 3)]))
    step([torch.ones(2, 12), torch.ones(2, 12, 3)])
    assert counter.frame_count == 1
    tensor = torch.ones(3, 6)
    assert mark_dynamic_batch(tensor) is tensor


# ---------------------------------------------------------------- warmup_shapes


def test_warmup_calls_once_per_distinct_shape_and_leaves_nothing_to_compile():
    counter = CompileCounter()
    step = torch.compile(_summed, backend=counter, dynamic=False)
    calls = []

    def fn(batch):
        calls.append(batch["input_ids"].shape)
        return step(batch)

    batches = [_batch(4, 8), _batch(4, 16), _batch(4, 8), _batch(2, 8), _batch(4, 16)]
    shapes = warmup_shapes(fn, batches)
    assert calls == [(4, 8), (4, 16), (2, 8)]
    assert [s["batch['input_ids']"] for s in shapes] == calls
    frames = counter.frame_count
    with no_recompiles():
        for batch in batches:
            step(batch)
    assert counter.frame_count == frames


_WARM_MODEL = None  # a module named as a global by the warm-up step below, as users write it


def _global_forward_backward(batch):
    _WARM_MODEL(**batch).loss.backward()


@pytest.mark.slow
@pytest.mark.parametrize("reach", ["global", "closure", "compiled_module", "model_arg"])
def test_warmup_leaves_no_gradients_for_the_first_optimizer_step(reach, monkeypatch):
    """The tour's loop (warm-up, then step before zero_grad) takes eager's first step.

    warmup_shapes used to leave the warm-up batches' gradients on the parameters, so the first
    ``optimizer.step()`` of a loop that zeroes after stepping used them too.
    """
    torch.manual_seed(0)
    model = tiny_models.gpt2()
    reference = tiny_models.gpt2()
    reference.load_state_dict(model.state_dict())
    compiled = torch.compile(model, backend="aot_eager")
    model.transformer.wte.weight.grad = torch.full_like(model.transformer.wte.weight, 0.5)
    kept = model.transformer.wte.weight.grad
    model.transformer.wte.weight.grad = None
    holder = {"model": compiled}

    def closure_step(batch):
        compiled(**batch).loss.backward()

    def dict_step(batch):
        holder["model"](**batch).loss.backward()

    monkeypatch.setattr(f"{__name__}._WARM_MODEL", compiled)
    fn, kwargs = {
        "global": (_global_forward_backward, {}),
        "closure": (closure_step, {}),
        "compiled_module": (lambda b: compiled(**b).loss.backward(), {}),
        "model_arg": (dict_step, {"model": model}),
    }[reach]
    warmup_shapes(fn, [_batch(2, 8), _batch(2, 16)], **kwargs)
    assert all(p.grad is None for p in model.parameters()), reach

    # a gradient that was there before the warm-up is there after it, in its own storage
    model.transformer.wte.weight.grad = kept
    warmup_shapes(fn, [_batch(2, 8)], **kwargs)
    assert model.transformer.wte.weight.grad is kept
    assert torch.equal(kept, torch.full_like(kept, 0.5))
    model.zero_grad(set_to_none=True)

    batch = _batch(2, 8)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    reference_optimizer = torch.optim.SGD(reference.parameters(), lr=0.1)
    compiled(**batch).loss.backward()
    optimizer.step()
    reference(**batch).loss.backward()
    reference_optimizer.step()
    for p, q in zip(model.parameters(), reference.parameters()):
        torch.testing.assert_close(p, q)


def test_warmup_restores_gradients_when_fn_raises():
    model = torch.nn.Linear(3, 1)

    def fn(batch):
        model(batch).sum().backward()
        raise RuntimeError("boom")

    with pytest.raises(RuntimeError, match="boom"):
        warmup_shapes(fn, [torch.ones(2, 3)])
    assert model.weight.grad is None


def test_warmup_model_argument_is_checked():
    with pytest.raises(TypeError, match="model= takes an nn.Module"):
        warmup_shapes(_summed, [_batch(2, 8)], model=3)


def test_warmup_warns_beyond_the_recompile_limit():
    step = torch.compile(_summed, backend=CompileCounter(), dynamic=False)
    with (
        torch._dynamo.config.patch(recompile_limit=2),
        pytest.warns(
            UserWarning,
            match="hit a recompile limit 1 time.*3 distinct shapes.*recompile_limit is 2",
        ),
    ):
        warmup_shapes(step, [_batch(2, n) for n in (4, 8, 12)])


def test_warmup_is_quiet_when_dynamic_graphs_cover_more_shapes_than_the_limit():
    """Measured, not predicted: 3 shapes over a limit of 2 with a dynamic graph hit nothing."""
    step = torch.compile(_summed, backend=CompileCounter(), dynamic=True)
    with torch._dynamo.config.patch(recompile_limit=2), warnings.catch_warnings():
        warnings.simplefilter("error")
        warmup_shapes(step, [_batch(2, n) for n in (4, 8, 12)])


# ---------------------------------------------------------------- no_recompiles


def test_no_recompiles_names_the_tensor_and_size():
    step = torch.compile(_summed, backend=CompileCounter(), dynamic=False)
    step(_batch(4, 8))
    expected = r"'input_ids'.*size 12 at dim 1"
    with pytest.raises(UnexpectedRecompileError, match=expected) as err, no_recompiles():
        step(_batch(4, 8))  # warmed up: fine
        step(_batch(4, 12))
    assert "compiled for 8" in str(err.value)
    assert isinstance(err.value, RuntimeError)


def test_no_recompiles_refuses_a_first_compile():
    step = torch.compile(_summed, backend=CompileCounter())
    with pytest.raises(UnexpectedRecompileError, match="never compiled"), no_recompiles():
        step(_batch(2, 4))


def test_no_recompiles_restores_the_previous_stance():
    counter = CompileCounter()
    step = torch.compile(_summed, backend=counter, dynamic=False)
    step(_batch(2, 4))
    with pytest.raises(UnexpectedRecompileError), no_recompiles():
        step(_batch(2, 5))
    step(_batch(2, 6))  # default stance again: compiles
    assert counter.frame_count == 2
    with torch.compiler.set_stance("eager_on_recompile"):
        with no_recompiles():
            step(_batch(2, 6))
        step(_batch(2, 7))  # back to eager_on_recompile: runs eagerly, no compile
    assert counter.frame_count == 2


def test_no_recompiles_eager_mode_runs_new_shapes_uncompiled():
    counter = CompileCounter()
    step = torch.compile(_summed, backend=counter, dynamic=False)
    step(_batch(2, 4))
    with no_recompiles(on_recompile="eager"):
        out = step(_batch(2, 9))
    assert counter.frame_count == 1
    assert out == _summed(_batch(2, 9))
    with pytest.raises(ValueError, match="on_recompile"), no_recompiles(on_recompile="warn"):
        pass


def test_other_runtime_errors_pass_through_unchanged():
    with pytest.raises(RuntimeError, match="boom") as err, no_recompiles():
        raise RuntimeError("boom")
    assert not isinstance(err.value, UnexpectedRecompileError)
