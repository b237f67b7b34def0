"""Inputs a new user passed that got a bare Python error, or nothing (issue 43): each is refused at
the call, naming the argument, the value and what to pass instead."""

from __future__ import annotations

import subprocess
import sys

import pytest
import tiny_models
import torch
from torch import nn

from torchcompile_kit import (
    BucketBatchSampler,
    compile_cache,
    compile_in_background,
    compile_model,
    compile_regional,
    get_regional_plan,
    load_compile_cache,
    mark_dynamic_batch,
    save_compile_cache,
    warmup_shapes,
)
from torchcompile_kit.cli import main
from torchcompile_kit.errors import BatchShapeError, NoRepeatedBlocksError


def test_a_sampler_without_buckets():
    with pytest.raises(BatchShapeError, match=r"buckets=None is not a sequence .*plan_buckets"):
        BucketBatchSampler([3, 4, 5], None, 2)


@pytest.mark.parametrize(
    ("batches", "match"),
    [
        (None, r"batches=None is not an iterable of batches"),
        (
            {"x": torch.ones(2, 3)},
            r"batches is one batch \(a dict\), not an iterable of batches; pass \[batch\]",
        ),
        (torch.ones(2, 3), r"batches is one batch \(a Tensor\)"),
    ],
    ids=["None", "one dict", "one tensor"],
)
def test_warmup_shapes_without_an_iterable_of_batches(batches, match):
    """A single batch would be iterated key by key (or row by row) and ``fn`` called on those."""
    calls = []
    with pytest.raises(TypeError, match=rf"warmup_shapes: {match}"):
        warmup_shapes(calls.append, batches)
    assert calls == []


@pytest.mark.parametrize(
    ("batch", "dims", "match"),
    [
        (
            {"input_ids": torch.ones(2, 8)},
            5,
            r"dims=5: no tensor of the batch has that dim .*\(2, 8\)",
        ),
        ("batch", 1, r"batch holds no tensor to mark \(got str"),
        ({"input_ids": torch.ones(2, 8)}, "1", r"dims='1' must be a dim \(int\)"),
    ],
    ids=["dim beyond every tensor", "no tensor", "dims as text"],
)
def test_mark_dynamic_batch_that_would_mark_nothing(batch, dims, match):
    with pytest.raises(BatchShapeError, match=match):
        mark_dynamic_batch(batch, dims)


def test_a_batch_where_some_tensors_lack_the_dim_is_still_marked():
    batch = {"input_ids": torch.ones(2, 8), "sample_weight": torch.ones(2)}
    mark_dynamic_batch(batch, 1)
    assert 1 in getattr(batch["input_ids"], "_dynamo_dynamic_indices", set())


@pytest.mark.parametrize(
    ("call", "name"),
    [
        (lambda: compile_cache(123).__enter__(), "compile_cache: path=123"),
        (lambda: load_compile_cache(None), "load_compile_cache: path=None"),
        (lambda: save_compile_cache(None), "save_compile_cache: path=None"),
    ],
    ids=["compile_cache", "load_compile_cache", "save_compile_cache"],
)
def test_a_cache_path_that_is_not_a_path(call, name):
    with pytest.raises(
        TypeError, match=rf"{name} is not a path; pass a file path, a folder or an fsspec URL"
    ):
        call()


def test_the_trainers_cache_path_is_checked_when_it_is_built(tmp_path):
    transformers = pytest.importorskip("transformers")
    from torchcompile_kit.integrations import CompileTrainer

    args = transformers.TrainingArguments(output_dir=str(tmp_path), use_cpu=True, report_to=[])
    with pytest.raises(
        TypeError, match=r"CompileTrainer\(compile_cache=...\): path=7 is not a path"
    ):
        CompileTrainer(model=tiny_models.gpt2(), args=args, compile_cache=7)


def test_background_options_that_are_not_options_or_a_compile_function():
    model = tiny_models.gpt2()
    with pytest.raises(TypeError, match=r"worker=5 must be BackgroundCompile\(...\) or None"):
        compile_in_background(model, worker=5)
    with pytest.raises(TypeError, match=r"compile_fn=.* must be compile_regional or compile_model"):
        compile_in_background(model, torch.compile)
    assert not any(
        hasattr(m, "_compiled_call_impl") and m._compiled_call_impl for m in model.modules()
    )


def test_a_background_factory_that_cannot_be_found_is_refused_at_the_call():
    from torchcompile_kit.regional import BackgroundCompile

    with pytest.raises(
        ValueError, match=r"factory='nosuch_tck_module:build': no module 'nosuch_tck_module'"
    ):
        compile_in_background(
            tiny_models.gpt2(), worker=BackgroundCompile(factory="nosuch_tck_module:build")
        )
    with pytest.raises(
        ValueError, match=r"factory='missing.py:build': file 'missing.py' does not exist"
    ):
        compile_in_background(
            tiny_models.gpt2(), compile_model, worker=BackgroundCompile(factory="missing.py:build")
        )


@pytest.mark.parametrize("name", ["background", "nested", "remainder", "fulgraph"])
def test_a_removed_or_misspelt_option_is_refused_before_anything_compiles(name):
    model = tiny_models.gpt2()
    with pytest.raises(TypeError, match=f"compile_regional.*{name}="):
        compile_regional(model, backend="eager", **{name: True})
    assert get_regional_plan(model) is None
    assert not any(
        hasattr(m, "_compiled_call_impl") and m._compiled_call_impl for m in model.modules()
    )


@pytest.mark.parametrize(
    "recipe", [compile_regional, compile_model], ids=["compile_regional", "compile_model"]
)
def test_precompile_as_text_is_refused(recipe):
    """``precompile="no"`` would have been truthy: it is refused, whatever it says."""
    with pytest.raises(
        TypeError, match=rf"{recipe.__name__}: precompile='no' must be True or False"
    ):
        recipe(tiny_models.gpt2(), precompile="no", backend="eager")


def test_compile_peft_checks_precompile_on_the_whole_model_path_too():
    peft = pytest.importorskip("peft")
    from torchcompile_kit import compile_peft

    model = peft.get_peft_model(tiny_models.gpt2(), peft.LoraConfig(r=4, target_modules=["c_attn"]))
    with pytest.raises(TypeError, match=r"compile_peft: precompile='yes' must be True or False"):
        compile_peft(model, regional=False, precompile="yes", backend="eager")


class _SequentialLayers(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.layers = nn.ModuleList([nn.Sequential(nn.Linear(4, 4), nn.ReLU()) for _ in range(3)])

    def forward(self, x):
        for layer in self.layers:
            x = layer(x)
        return x


def test_a_modulelist_of_sequentials_is_told_to_select_them_by_path():
    """The message said no class occurs twice inside a ModuleList, which was false."""
    model = _SequentialLayers()
    with pytest.raises(
        NoRepeatedBlocksError,
        match=r"children of 'layers' are plain containers.*blocks='layers\.\*'",
    ):
        compile_regional(model, backend="eager")
    compile_regional(model, backend="eager", blocks="layers.*")  # what it says works
    assert model(torch.ones(2, 4)).shape == (2, 4)


def _refused(argv, capsys) -> str:
    with pytest.raises(SystemExit) as exit_:
        main(argv)
    assert exit_.value.code == 2
    return capsys.readouterr().err


def test_bench_refuses_a_timeout_that_is_not_positive(capsys):
    assert "argument --timeout: must be > 0, got -1" in _refused(
        ["bench", "--timeout", "-1", "eager"], capsys
    )


def test_bench_refuses_pinning_to_cpus_this_process_cannot_use(capsys):
    err = _refused(["bench", "--pin", "0:4096", "eager"], capsys)
    assert "argument --pin: CPU(s) [4096] are not available to this process" in err


def test_an_unknown_recipe_is_refused_with_a_guess_before_torch_is_imported():
    code = (
        "import sys\nfrom torchcompile_kit.cli import main\nstatus = main(['bench', 'regionl'])\n"
        "print(status, 'torch' in sys.modules)"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120
    )
    assert out.stdout.split() == ["2", "False"]
    assert "unknown recipe(s) ['regionl']; 'regionl': did you mean 'regional'?" in out.stderr
