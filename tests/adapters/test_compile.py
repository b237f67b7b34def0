"""compile_peft with the real peft library on tiny models: the method matrix, in-place compile,
refusals, runtime guards, hotswap and save/reload."""

from __future__ import annotations

import functools
import warnings

import pytest
import torch
from peft import (
    AdaLoraConfig,
    BOFTConfig,
    HRAConfig,
    IA3Config,
    LNTuningConfig,
    LoHaConfig,
    LoKrConfig,
    LoraConfig,
    OFTConfig,
    PeftModel,
    VeraConfig,
    get_peft_model,
)
from tiny_models import gpt2, opt, token_batch
from torch._dynamo.testing import CompileCounter

from torchcompile_kit import check_compile_equivalence, compile_peft
from torchcompile_kit.errors import UnsafeAdapterConfigError

pytestmark = [
    pytest.mark.filterwarnings("ignore:fan_in_fan_out:UserWarning"),
    pytest.mark.filterwarnings("ignore:`is_gradient_checkpointing` is deprecated:FutureWarning"),
    # expected graph-break warnings of DoRA/LoKr/LoHa: asserted in tests/adapters/test_rules.py
    pytest.mark.filterwarnings("ignore:\\[(dora|lokr-loha)-.*graph-breaks\\]:UserWarning"),
]

GPT2_ATTN = ["c_attn"]
OPT_ATTN = ["q_proj", "v_proj"]

# name -> (base model builder, adapter config)
MATRIX = {
    "lora": (gpt2, lambda: LoraConfig(r=4, target_modules=GPT2_ATTN)),
    "lora-embedding": (opt, lambda: LoraConfig(r=4, target_modules=["embed_tokens", *OPT_ATTN])),
    "dora": (opt, lambda: LoraConfig(r=4, target_modules=OPT_ATTN, use_dora=True)),
    "ia3": (
        gpt2,
        lambda: IA3Config(
            target_modules=["c_attn", "mlp.c_proj"], feedforward_modules=["mlp.c_proj"]
        ),
    ),
    "vera": (gpt2, lambda: VeraConfig(r=4, target_modules=GPT2_ATTN)),
    "adalora": (
        gpt2,
        lambda: AdaLoraConfig(init_r=4, target_r=2, target_modules=GPT2_ATTN, total_step=10),
    ),
    "lokr": (opt, lambda: LoKrConfig(r=4, target_modules=OPT_ATTN)),
    "loha": (opt, lambda: LoHaConfig(r=4, target_modules=OPT_ATTN)),
    "oft": (opt, lambda: OFTConfig(r=0, oft_block_size=8, target_modules=OPT_ATTN)),
    "boft": (opt, lambda: BOFTConfig(boft_block_size=4, target_modules=OPT_ATTN)),
    "hra": (opt, lambda: HRAConfig(r=4, target_modules=OPT_ATTN)),
    "ln-tuning": (opt, lambda: LNTuningConfig(target_modules=["self_attn_layer_norm"])),
    "modules-to-save": (
        gpt2,
        lambda: LoraConfig(r=4, target_modules=GPT2_ATTN, modules_to_save=["ln_f"]),
    ),
}


def build(name: str, seed: int = 0):
    base_builder, config = MATRIX[name]
    torch.manual_seed(seed)
    return get_peft_model(base_builder(), config())


def lora_gpt2(*, seed: int = 0, r: int = 4, **config):
    """LoRA whose B is set from its own generator: the adapter changes the outputs, and a reload
    that fails to load it (and re-initialises B to zero) cannot match by coincidence."""
    torch.manual_seed(seed)
    # use_cache=False, as fine-tuning scripts set it: eval forwards run the compiled blocks (a
    # forward that builds a KV cache runs them eagerly: tests/regional/test_compile.py)
    model = get_peft_model(
        gpt2(use_cache=False), LoraConfig(r=r, target_modules=GPT2_ATTN, **config)
    )
    set_lora_b(model, seed)
    return model


def set_lora_b(model, seed: int):
    generator = torch.Generator().manual_seed(1000 + seed)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "lora_B" in name:
                param.copy_(torch.randn(param.shape, generator=generator) * 0.1)


def logits(model, batch=None):
    batch = batch or token_batch()
    with torch.no_grad():
        return model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits


# --- the matrix -------------------------------------------------------------------------------


# each of these takes 5-10 s on a 2-core CPU: run with the slow tests, LoRA's rows stay in the
# quick suite
SLOW_MATRIX = {"adalora", "boft", "dora", "hra", "loha", "lokr", "oft"}


@pytest.mark.parametrize(
    "name",
    [
        pytest.param(name, marks=pytest.mark.slow if name in SLOW_MATRIX else ())
        for name in sorted(MATRIX)
    ],
)
def test_matrix(name):
    report = check_compile_equivalence(
        build(name), token_batch(), backend="aot_eager", compile_fn=compile_peft
    )
    assert report.ok, report.summary()
    assert any("perturbed" in note for note in report.notes)
    assert not any("do not change" in note for note in report.notes), report.notes
    assert any(d.name.startswith("grad.") for d in report.diffs)


@pytest.mark.slow
@pytest.mark.parametrize("name", ["lora", "lokr"])
def test_matrix_inductor(name):
    report = check_compile_equivalence(build(name), token_batch(), compile_fn=compile_peft)
    assert report.ok, report.summary()


@pytest.mark.slow
def test_whole_model_compile_matches_eager():
    compile_whole = functools.partial(compile_peft, regional=False)
    torch.manual_seed(0)
    model = get_peft_model(opt(use_cache=False), LoraConfig(r=4, target_modules=OPT_ATTN))
    report = check_compile_equivalence(
        model, token_batch(), backend="aot_eager", compile_fn=compile_whole
    )
    assert report.ok, report.summary()


# --- in place: keys, save and reload ----------------------------------------------------------


@pytest.mark.parametrize("regional", [True, False])
def test_compile_is_in_place_and_keys_stay_clean(regional):
    model = lora_gpt2()
    keys = list(model.state_dict())
    assert compile_peft(model, regional=regional, backend="eager") is model
    assert list(model.state_dict()) == keys
    compiled = [n for n, m in model.named_modules() if getattr(m, "_compiled_call_impl", None)]
    assert compiled == (
        [""]
        if not regional
        else ["base_model.model.transformer.h.0", "base_model.model.transformer.h.1"]
    )


def test_save_and_reload_round_trips(tmp_path):
    model = compile_peft(lora_gpt2(seed=0), backend="aot_eager")
    model.eval()
    compiled_out = logits(model)
    model.save_pretrained(tmp_path)

    torch.manual_seed(0)  # the same base weights as lora_gpt2(seed=0)
    fresh_base = gpt2(use_cache=False)
    base_out = logits(fresh_base)
    reloaded = PeftModel.from_pretrained(fresh_base, tmp_path).eval()
    assert not torch.allclose(base_out, compiled_out)  # the adapter matters
    torch.testing.assert_close(logits(reloaded), compiled_out, rtol=0, atol=0)


def test_peft_on_compiled_base_reloads_as_base_model(tmp_path):
    """The silent hazard behind rule peft-on-compiled-model, shown with real peft."""
    torch.manual_seed(0)
    model = get_peft_model(
        torch.compile(gpt2(), backend="eager"), LoraConfig(r=4, target_modules=GPT2_ATTN)
    )
    set_lora_b(model, 0)
    assert any("_orig_mod" in key for key in model.state_dict())
    adapted = logits(model.eval())
    model.save_pretrained(tmp_path)
    torch.manual_seed(0)
    fresh_base = gpt2(use_cache=False)
    base_out = logits(fresh_base)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # peft: "Found missing adapter keys" - the only sign
        reloaded = PeftModel.from_pretrained(fresh_base, tmp_path).eval()
    torch.testing.assert_close(logits(reloaded), base_out)
    assert not torch.allclose(adapted, base_out)
    with pytest.raises(UnsafeAdapterConfigError, match=r"\[peft-on-compiled-model\].*_orig_mod"):
        compile_peft(model, backend="eager")


@pytest.mark.parametrize("how", ["torch.compile", "module.compile", "compile_peft"])
def test_already_compiled_model_is_refused_both_ways(how):
    model = lora_gpt2()
    if how == "torch.compile":
        model = torch.compile(model, backend="eager")
    elif how == "module.compile":
        model.compile(backend="eager")
    else:
        compile_peft(model, backend="eager")
    with pytest.raises(UnsafeAdapterConfigError, match=r"\[already-compiled\]"):
        compile_peft(model, backend="eager")


def test_fullgraph_dora_is_refused_before_compiling():
    model = build("dora")
    with pytest.raises(UnsafeAdapterConfigError, match=r"\[dora-fullgraph\]"):
        compile_peft(model, backend="eager", fullgraph=True)
    assert not [m for m in model.modules() if getattr(m, "_compiled_call_impl", None)]


def test_freezing_and_training_is_refused():
    with pytest.raises(UnsafeAdapterConfigError, match=r"\[inductor-freezing-training\]"):
        compile_peft(lora_gpt2().train(), options={"freezing": True})


# --- runtime guards ---------------------------------------------------------------------------


def two_adapters():
    model = lora_gpt2()
    model.add_adapter("other", LoraConfig(r=4, target_modules=GPT2_ATTN))
    set_lora_b(model, 1)
    return model.eval()


@pytest.mark.parametrize("regional", [True, False])
def test_adapter_names_under_fullgraph_is_refused(regional):
    model = compile_peft(two_adapters(), regional=regional, backend="eager", fullgraph=True)
    batch = token_batch()
    with pytest.raises(
        UnsafeAdapterConfigError, match=r"\[mixed-batch-fullgraph\].*'default', 'other'"
    ):
        model(input_ids=batch["input_ids"], adapter_names=["default", "other"])


def test_adapter_names_without_fullgraph_runs_and_matches_eager():
    eager = two_adapters()
    batch = token_batch()
    names = ["default", "other"]
    with torch.no_grad():
        expected = eager(input_ids=batch["input_ids"], adapter_names=names).logits
    model = compile_peft(two_adapters(), backend="aot_eager")
    with torch.no_grad():
        got = model(input_ids=batch["input_ids"], adapter_names=names).logits
    torch.testing.assert_close(got, expected)


def test_guard_warns_past_recompile_limit():
    model = lora_gpt2()
    for name in ("b", "c", "d"):
        model.add_adapter(name, LoraConfig(r=4, target_modules=GPT2_ATTN))
    set_lora_b(model, 2)
    counter = CompileCounter()
    with torch._dynamo.config.patch(recompile_limit=2):
        with pytest.warns(UserWarning, match=r"\[many-adapters\] 4 adapters"):
            compile_peft(model.eval(), backend=counter)
        # compile_regional sized the blocks' limit for training's 2 requires_grad variants
        # (block 0's input comes from frozen embeddings) and evaluation's 1, on every torch
        limit = 3
        outputs = {}
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            for name in ("default", "b", "c", "d"):
                model.set_adapter(name)
                outputs[name] = logits(model)
        ours = [w for w in caught if "[recompile-limit]" in str(w.message)]
        assert len(ours) == 1
        assert f"distinct adapter states (recompile_limit={limit})" in str(ours[0].message)
        assert "hotswap" in str(ours[0].message)
    assert counter.frame_count == limit  # the last adapters ran eagerly: dynamo gave up silently
    assert not torch.allclose(outputs["b"], outputs["c"])


def test_generate_warns_for_whole_model_compile_only():
    batch = token_batch(batch=1, length=4)
    model = compile_peft(lora_gpt2().eval(), regional=False, backend="eager")
    with pytest.warns(UserWarning, match=r"\[generate-uncompiled\]"):
        model.generate(input_ids=batch["input_ids"], max_new_tokens=1, do_sample=False)
    regional = compile_peft(lora_gpt2().eval(), backend="eager", generate="compiled")
    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)
        regional.generate(input_ids=batch["input_ids"], max_new_tokens=1, do_sample=False)


def test_disable_adapter_and_merge_are_allowed_on_current_peft():
    batch = token_batch()
    eager = lora_gpt2().eval()
    with eager.disable_adapter():
        expected_base = logits(eager, batch)
    model = compile_peft(lora_gpt2().eval(), backend="aot_eager")
    adapted = logits(model, batch)
    with model.disable_adapter():
        torch.testing.assert_close(logits(model, batch), expected_base)
    merged = model.merge_and_unload()
    torch.testing.assert_close(logits(merged, batch), adapted, rtol=1e-4, atol=1e-5)


# --- hotswap ----------------------------------------------------------------------------------


def test_hotswap_target_rank_prepares_for_recompile_free_swaps(tmp_path):
    from peft.utils.hotswap import hotswap_adapter

    bigger = lora_gpt2(seed=1, r=8).eval()
    bigger.save_pretrained(tmp_path)
    expected = logits(bigger)

    counter = CompileCounter()
    model = compile_peft(lora_gpt2(seed=1, r=4).eval(), backend=counter, hotswap_target_rank=8)
    lora_a = model.base_model.model.transformer.h[0].attn.c_attn.lora_A["default"]
    assert lora_a.out_features == 8
    logits(model)
    frames = counter.frame_count
    hotswap_adapter(model, str(tmp_path), adapter_name="default")
    torch.testing.assert_close(logits(model), expected, rtol=1e-4, atol=1e-5)
    assert counter.frame_count == frames  # no recompile


def test_hotswap_needs_lora():
    with pytest.raises(ValueError, match=r"hotswap_target_rank=8 needs LoRA adapters only.*'LOKR'"):
        compile_peft(build("lokr").eval(), backend="eager", hotswap_target_rank=8)


@pytest.mark.parametrize("regional", [True, False])
def test_uncompile_removes_the_runtime_checks(regional):
    from torchcompile_kit import uncompile

    batch = token_batch()
    names = ["default", "default"]
    model = compile_peft(lora_gpt2().eval(), regional=regional, fullgraph=True, backend="eager")
    with pytest.raises(UnsafeAdapterConfigError, match=r"\[mixed-batch-fullgraph\]"):
        model(input_ids=batch["input_ids"], adapter_names=names)
    uncompile(model)
    assert all(getattr(m, "_compiled_call_impl", None) is None for m in model.modules())
    with torch.no_grad():  # eager again, and the runtime refusal went with the compile
        model(input_ids=batch["input_ids"], adapter_names=names)
    assert "generate" not in model.__dict__
