"""compile_regional and transformers' KV cache: training forwards run without one (compiled,
one graph for every block); a forward that builds or passes a cache (eval mode with the config's
default, ``use_cache=True``, ``generate()``) runs the blocks eagerly and returns eager's outputs,
cache included; ``keep_kv_cache=True`` compiles those calls and pays a graph per layer."""

from __future__ import annotations

import copy
import inspect
import warnings

import pytest
import tiny_models as tm
import torch
from torch._dynamo.testing import CompileCounter

from torchcompile_kit import CompileMonitor, _dynamo, compile_peft, compile_regional, uncompile


def cache_of(output):
    """The output's cache (``cache`` from transformers 5.24, ``past_key_values`` before)."""
    return output.get("cache", output.get("past_key_values"))


def cache_keyword(model) -> str:
    """The forward argument a decoding step passes the cache in, on this transformers."""
    return "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"


def layer_keys(cache):
    return [layer.keys for layer in cache.layers]


def assert_same_cache(got, expected):
    assert type(got) is type(expected)
    for a, b in zip(layer_keys(got), layer_keys(expected), strict=True):
        torch.testing.assert_close(a, b)


@pytest.mark.parametrize("builder", [tm.gpt2, tm.llama])
def test_a_training_forward_is_compiled_without_a_cache(builder):
    model = builder(n_layer=3)
    assert model.config.use_cache is True  # transformers' default: the trap
    counter = CompileCounter()
    compile_regional(model, backend=counter, compile_loss=False)  # count the blocks' graphs
    output = model(**tm.token_batch())
    output.loss.backward()
    assert counter.frame_count == 1  # one graph for all three blocks
    assert cache_of(output) is None  # training forwards get use_cache=False unless they ask


@pytest.mark.parametrize("builder", [tm.gpt2, tm.llama])
def test_eval_forwards_and_generate_return_eagers_outputs_cache_included(builder):
    torch.manual_seed(0)
    eager = builder(n_layer=3).eval()
    model = compile_regional(copy.deepcopy(eager), backend="aot_eager")
    batch = {"input_ids": tm.token_batch()["input_ids"]}
    with CompileMonitor() as monitor, torch.no_grad():
        with pytest.warns(UserWarning, match=r"eval mode.*run such calls eagerly.*use_cache=False"):
            got = model(**batch)  # the config's use_cache=True: a cache, as eager builds
        expected = eager(**batch)
        torch.testing.assert_close(got.logits, expected.logits)
        assert_same_cache(cache_of(got), cache_of(expected))
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # said once per model
            asked = model(**batch, use_cache=True)
        assert_same_cache(cache_of(asked), cache_of(expected))
        prompt = batch["input_ids"][:1, :5]
        tokens = model.generate(prompt, max_new_tokens=6, do_sample=False)
        assert torch.equal(tokens, eager.generate(prompt, max_new_tokens=6, do_sample=False))
        assert monitor.snapshot()["graphs"] == 0  # every one of these calls ran eagerly
        compiled = model(**batch, use_cache=False)  # how to evaluate compiled
        torch.testing.assert_close(compiled.logits, expected.logits)
        assert cache_of(compiled) is None
    assert monitor.snapshot()["graphs"] == 1


def test_gpt2_tester_checks_pass_on_a_regionally_compiled_base_model():
    """The checks of transformers' GPT-2 tester (create_and_check_gpt2_model and ..._past): eval
    mode, the cache by default, by use_cache=True, none with use_cache=False, and a decoding step
    from the returned cache equal to the full forward."""
    from transformers import GPT2Config, GPT2Model

    torch.manual_seed(0)
    config = GPT2Config(vocab_size=99, n_positions=64, n_embd=32, n_layer=5, n_head=4)
    eager = GPT2Model(config).eval()
    model = compile_regional(copy.deepcopy(eager), backend="aot_eager")
    ids = torch.randint(0, 99, (3, 7))
    types = torch.randint(0, 16, (3, 7))
    with warnings.catch_warnings(), torch.no_grad():
        warnings.simplefilter("ignore")  # the once-per-model note on cache-building forwards
        result = model(ids, token_type_ids=types)
        assert result.last_hidden_state.shape == (3, 7, 32)
        assert len(cache_of(result)) == config.n_layer

        outputs = model(ids, token_type_ids=types, use_cache=True)
        by_config = model(ids, token_type_ids=types)
        no_past = model(ids, token_type_ids=types, use_cache=False)
        assert len(outputs) == len(by_config) == len(no_past) + 1

        next_ids, next_types = torch.randint(0, 99, (3, 1)), torch.randint(0, 16, (3, 1))
        full = model(
            torch.cat([ids, next_ids], -1), token_type_ids=torch.cat([types, next_types], -1)
        )
        step = model(
            next_ids, token_type_ids=next_types, **{cache_keyword(model): cache_of(outputs)}
        )
        torch.testing.assert_close(step.last_hidden_state[:, 0], full.last_hidden_state[:, -1])
        torch.testing.assert_close(
            result.last_hidden_state, eager(ids, token_type_ids=types).last_hidden_state
        )


@pytest.mark.parametrize("builder", [tm.gpt2, tm.llama])
def test_keep_kv_cache_compiles_the_cache_calls_a_graph_per_layer(builder):
    """GPT-2 reads layer_idx in its own code, Llama hands it to cache.update: both are a graph
    per layer, predicted and budgeted (no recompile-limit hit, no layer left eager)."""
    model = builder(n_layer=10)
    counter = CompileCounter()
    with pytest.warns(UserWarning, match="layer_idx.*use_cache=False"):
        compile_regional(model, backend=counter, keep_kv_cache=True, compile_loss=False)
    model(**tm.token_batch()).loss.backward()
    # a graph per layer: what the default avoids; the group's limit is sized for them on every
    # torch (before torch 2.13 the global limit of 8 used to cap it: the last layers ran eagerly)
    assert counter.frame_count == 10


def test_uncompile_removes_the_eager_routing_and_the_hook():
    model = compile_regional(tm.gpt2(), backend="eager")
    uncompile(model)
    assert not _dynamo.compiled_module_names(model)
    model.train()
    assert cache_of(model(**tm.token_batch())) is not None  # transformers' default again


def test_compile_peft_generate_compiled_compiles_the_cache_calls():
    from peft import LoraConfig, get_peft_model

    torch.manual_seed(0)
    model = get_peft_model(tm.gpt2(), LoraConfig(r=4, target_modules=["c_attn"])).eval()
    compile_peft(model, backend="eager", generate="compiled")
    with CompileMonitor() as monitor:
        model.generate(tm.token_batch()["input_ids"][:1, :5], max_new_tokens=2, do_sample=False)
    assert monitor.snapshot()["graphs"] >= 2  # compiled: a graph per layer at least
