"""compile_regional, find_repeated_blocks, uncompile: discovery, reuse, numerics, keys, errors."""

from __future__ import annotations

import copy
import functools
import warnings

import pytest
import tiny_models as tm
import torch
from torch import nn
from torch._dynamo.testing import CompileCounter, CompileCounterWithBackend

from torchcompile_kit import _dynamo, compile_model, compile_regional, fix_loss_function, uncompile
from torchcompile_kit.errors import (
    BlockSelectorError,
    NoRepeatedBlocksError,
    UnsafeCompileModeError,
)
from torchcompile_kit.regional import find_repeated_blocks, get_regional_plan

# --- toy models ----------------------------------------------------------------------------


class Block(nn.Module):
    def __init__(self, dim: int = 8, layer_idx: int = 0):
        super().__init__()
        self.lin = nn.Linear(dim, dim)
        self.norm = nn.LayerNorm(dim)
        self.layer_idx = layer_idx  # distinct per instance, never read by forward

    def forward(self, x):
        return x + self.norm(torch.relu(self.lin(x)))


class IndexedBlock(Block):
    def forward(self, x):
        return x + self.norm(self.lin(x)) * (self.layer_idx + 1)  # dynamo specializes on it


class Stack(nn.Module):
    def __init__(
        self, n: int = 4, dim: int = 8, scale_by_idx: bool = False, container=nn.ModuleList
    ):
        super().__init__()
        self.embed = nn.Linear(dim, dim)
        blocks = [(IndexedBlock if scale_by_idx else Block)(dim, i) for i in range(n)]
        if container is nn.ModuleDict:
            self.layers = nn.ModuleDict({str(i): b for i, b in enumerate(blocks)})
        elif container is nn.Sequential:
            self.layers = nn.Sequential(*blocks)
        else:
            self.layers = nn.ModuleList(blocks)
        self.head = nn.Linear(dim, 2)

    def forward(self, x):
        x = self.embed(x)
        layers = self.layers.values() if isinstance(self.layers, nn.ModuleDict) else self.layers
        for layer in layers:
            x = layer(x)
        return self.head(x)


class Processor:
    def __call__(self, x):
        return x * 2


class BlockWithProcessor(Block):
    def __init__(self, dim: int = 8):
        super().__init__(dim)
        self.processor = Processor()  # one object per block, as diffusers' attention processors

    def forward(self, x):
        return x + self.processor(self.lin(x))


# --- discovery -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("builder", "expected"),
    [
        (tm.gpt2, {"GPT2Block": 2}),
        (tm.llama, {"LlamaDecoderLayer": 2}),
        (tm.bert, {"BertLayer": 2}),
        (tm.t5, {"T5Block": 4}),
        (tm.vit, {"ViTLayer": 2}),
        (tm.vision_encoder_decoder, {"ViTLayer": 2, "GPT2Block": 2}),
    ],
)
def test_discovery_on_architectures(builder, expected):
    model = builder()
    plan = find_repeated_blocks(model)
    found = {g.class_name: len(g.names) for g in plan.groups}
    assert found == expected
    named = dict(model.named_modules())
    for group in plan.groups:
        assert all(type(named[n]).__name__ == group.class_name for n in group.names)
    # the eager remainder covers every parameter that is not inside a block
    in_blocks = {id(p) for n in plan.blocks for p in named[n].parameters()}
    in_eager = {id(p) for n in plan.eager for p in named[n].parameters()}
    assert in_blocks.isdisjoint(in_eager)
    assert in_blocks | in_eager == {id(p) for p in model.parameters()}


def test_bert_embeddings_hint_is_not_a_block():
    model = tm.bert()
    assert "BertEmbeddings" in model._no_split_modules
    plan = find_repeated_blocks(model)
    assert "bert.embeddings" in plan.eager
    assert all(g.class_name != "BertEmbeddings" for g in plan.groups)


@pytest.mark.parametrize("container", [nn.ModuleList, nn.ModuleDict, nn.Sequential])
def test_discovery_in_every_container(container):
    plan = find_repeated_blocks(Stack(n=3, container=container))
    assert plan.blocks == [f"layers.{i}" for i in range(3)]
    assert plan.eager == ["embed", "head"]
    assert plan.summary() == "compiled 3 × Block; eager: embed, head"


def test_leaf_modules_in_a_sequential_are_not_blocks():
    model = nn.Sequential(nn.Linear(4, 4), nn.ReLU(), nn.Linear(4, 4))
    with pytest.raises(NoRepeatedBlocksError, match="blocks="):
        find_repeated_blocks(model)


# --- compiling: reuse, numerics -------------------------------------------------------------


def _grads(model):
    return {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


def _check_matches_eager(builder, backend, batch):
    eager = builder()
    compiled = copy.deepcopy(eager)
    compile_regional(compiled, backend=backend)
    out_e, out_c = eager(**batch), compiled(**batch)
    torch.testing.assert_close(out_c.logits, out_e.logits)
    out_e.loss.backward()
    out_c.loss.backward()
    grads_e, grads_c = _grads(eager), _grads(compiled)
    assert grads_e.keys() == grads_c.keys() and len(grads_e) == len(list(eager.parameters()))
    for name in grads_e:
        torch.testing.assert_close(grads_c[name], grads_e[name], msg=name)


@pytest.mark.parametrize(
    "builder", [tm.gpt2, tm.llama, pytest.param(tm.t5, marks=pytest.mark.slow)]
)
def test_outputs_and_grads_match_eager_aot_eager(builder):
    batch = tm.token_batch()
    if builder is tm.t5:
        batch = {"input_ids": batch["input_ids"], "labels": batch["labels"]}
    _check_matches_eager(builder, "aot_eager", batch)


@pytest.mark.slow
def test_outputs_and_grads_match_eager_inductor():
    _check_matches_eager(tm.gpt2, "inductor", tm.token_batch())


class _CheckpointedBlock(Block):
    """accelerate's case: a block whose __call__ checkpoints, and a graph break in its forward."""

    def __init__(self, use_reentrant: bool):
        super().__init__()
        self.use_reentrant = use_reentrant

    def __call__(self, *args, **kwargs):
        from torch.utils.checkpoint import checkpoint

        return checkpoint(
            functools.partial(super().__call__, **kwargs), *args, use_reentrant=self.use_reentrant
        )

    def forward(self, x):
        x = self.lin(x)
        torch._dynamo.graph_break()
        return self.norm(x).sin()


@pytest.mark.parametrize("use_reentrant", [True, False])
def test_checkpointed_blocks_compile_across_a_graph_break_and_match_eager(use_reentrant):
    torch.manual_seed(0)
    eager = Stack(n=2)
    eager.layers = nn.ModuleList([_CheckpointedBlock(use_reentrant) for _ in range(2)])
    model = copy.deepcopy(eager)
    counter = CompileCounter()
    compile_regional(model, backend=counter)
    inputs = torch.randn(3, 8, requires_grad=True)
    twin = inputs.detach().clone().requires_grad_()
    eager(inputs).sum().backward()
    model(twin).sum().backward()
    assert counter.frame_count >= 1  # the blocks reached the compiler
    torch.testing.assert_close(twin.grad, inputs.grad)
    for name, grad in _grads(eager).items():
        torch.testing.assert_close(_grads(model)[name], grad, msg=name)


def test_vision_encoder_decoder_compiles_both_stacks():
    model = tm.vision_encoder_decoder()
    counter = CompileCounter()
    compile_regional(model, backend=counter)
    pixel_values = torch.randn(2, 3, 32, 32)
    labels = torch.randint(3, tm.VOCAB, (2, 8))
    model(pixel_values=pixel_values, labels=labels).loss.backward()
    assert counter.frame_count == 2  # one graph for ViTLayer, one for GPT2Block


# --- state dict --------------------------------------------------------------------------------


def test_state_dict_keys_unchanged_and_checkpoints_load_both_ways():
    model = tm.gpt2()
    before = model.state_dict()
    saved = {k: v.clone() for k, v in before.items()}
    compile_regional(model, backend="aot_eager")
    after = model.state_dict()
    assert list(after) == list(before)
    assert not [k for k in after if "_orig_mod" in k]

    batch = tm.token_batch()
    fresh = tm.gpt2()  # other random weights
    compile_regional(fresh, backend="aot_eager")
    fresh.load_state_dict(saved)  # saved before compiling, loaded after
    torch.testing.assert_close(fresh(**batch).logits, model(**batch).logits)

    eager = tm.gpt2()
    eager.load_state_dict(fresh.state_dict())  # saved compiled, loaded eager
    torch.testing.assert_close(eager(**batch).logits, model(**batch).logits)


# --- idempotence, uncompile ------------------------------------------------------------------


def test_second_call_is_a_noop_with_warning():
    model = tm.gpt2()
    compile_regional(model, backend="eager")
    plan = get_regional_plan(model)
    with pytest.warns(UserWarning, match="already compiled"):
        assert compile_regional(model, backend="aot_eager") is model
    assert get_regional_plan(model) is plan
    assert all(g.compile_kwargs["backend"] == "eager" for g in plan.groups)


def test_uncompile_restores_eager():
    model = Stack(n=3)
    counter = CompileCounter()
    assert compile_regional(model, backend=counter) is model
    x = torch.randn(2, 8)
    model(x)
    assert counter.frame_count == 1
    assert uncompile(model) is model
    assert get_regional_plan(model) is None
    assert all(getattr(m, "_compiled_call_impl", None) is None for m in model.modules())
    torch._dynamo.reset()
    model(torch.randn(5, 8))  # a new shape would have compiled again
    assert counter.frame_count == 1
    compile_regional(model, backend=counter)  # and it can be compiled again without warning
    model(x)
    assert counter.frame_count == 2


def test_uncompile_removes_the_cache_hook():
    model = compile_regional(tm.gpt2(), backend="eager")
    uncompile(model)
    assert model(**tm.token_batch()).past_key_values is not None  # transformers default again


# --- selectors -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "blocks",
    [Block, "Block", [Block], ["Block"], "layers.*", ["layers.0", "layers.1", "layers.2"]],
)
def test_blocks_selector_forms(blocks):
    plan = find_repeated_blocks(Stack(n=3), blocks=blocks)
    assert plan.blocks == ["layers.0", "layers.1", "layers.2"]


def test_class_selector_matches_subclasses_and_renamed_classes():
    model = Stack(n=2)
    model.layers.append(BlockWithProcessor())
    assert len(find_repeated_blocks(model, blocks=Block).blocks) == 3
    assert len(find_repeated_blocks(model, blocks="Block").blocks) == 3  # by MRO name


def test_pattern_selects_one_stack_only():
    model = tm.vision_encoder_decoder()
    plan = find_repeated_blocks(model, blocks="encoder.layers.*")
    assert [g.class_name for g in plan.groups] == ["ViTLayer"]
    assert plan.blocks == ["encoder.layers.0", "encoder.layers.1"]
    assert plan.eager[-1] == "decoder"  # the whole decoder stays eager


def test_mapping_gives_per_group_compile_kwargs():
    model = tm.vision_encoder_decoder()
    enc, dec = CompileCounter(), CompileCounter()
    blocks = {"ViTLayer": {"backend": enc}, "decoder.transformer.h.*": {"backend": dec}}
    compile_regional(model, blocks=blocks)
    plan = get_regional_plan(model)
    assert [(g.selector, g.class_name) for g in plan.groups] == [
        ("ViTLayer", "ViTLayer"),
        ("decoder.transformer.h.*", "GPT2Block"),
    ]
    model(pixel_values=torch.randn(2, 3, 32, 32), labels=torch.randint(3, tm.VOCAB, (2, 8)))
    assert (enc.frame_count, dec.frame_count) == (1, 1)


def test_modular_compile_of_whole_submodules():
    # the post's modular compilation: encoder and decoder each one region
    model = tm.vision_encoder_decoder()
    plan = find_repeated_blocks(model, blocks={"encoder": {"mode": "max-autotune"}, "decoder": {}})
    assert plan.blocks == ["encoder", "decoder"]
    assert plan.groups[0].compile_kwargs == {"mode": "max-autotune"}


def test_global_kwargs_are_overridden_per_group():
    model = Stack(n=2)
    compile_regional(model, blocks={"Block": {"dynamic": True}}, backend="eager", dynamic=False)
    (group,) = get_regional_plan(model).groups
    assert group.compile_kwargs == {"backend": "eager", "dynamic": True}


# --- guard preflight -------------------------------------------------------------------------


def test_preflight_warns_on_distinct_int_read_in_forward_and_sizes_limit():
    model = Stack(n=12, scale_by_idx=True)
    counter = CompileCounter()
    with pytest.warns(UserWarning, match=r"12 of 12 IndexedBlock blocks.*`layer_idx`.*argument"):
        compile_regional(model, backend=counter)
    (group,) = get_regional_plan(model).groups
    assert group.budget.limit >= 12  # raised around the group's calls, on every torch
    eager = copy.deepcopy(model)
    uncompile(eager)
    x = torch.randn(2, 8)
    torch.testing.assert_close(model(x), eager(x))
    assert counter.frame_count == 12  # every layer compiled: none silently fell back to eager


@pytest.mark.skipif(
    _dynamo.recompile_limit_kwarg() is None,
    reason="only a per-call limit (torch >= 2.13) can hold the blocks to 8 now",
)
def test_without_sizing_the_limit_blocks_fall_back_to_eager():
    # the failure the sizing prevents: same model, a limit of 8 given by the user is kept
    model = Stack(n=12, scale_by_idx=True)
    counter = CompileCounter()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        compile_regional(model, backend=counter, recompile_limit=8)
    model(torch.randn(2, 8))
    assert counter.frame_count == 8


def test_preflight_silent_when_distinct_int_is_not_read():
    model = Stack(n=4, scale_by_idx=False)  # layer_idx differs but forward never reads it
    counter = CompileCounter()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        compile_regional(model, backend=counter)
    model(torch.randn(2, 8))
    assert counter.frame_count == 1


def test_preflight_warns_on_per_block_objects():
    model = Stack(n=3)
    model.layers = nn.ModuleList([BlockWithProcessor() for _ in range(3)])
    with pytest.warns(UserWarning, match="`processor` .*distinct object per block"):
        compile_regional(model, backend="eager")


def test_preflight_silent_on_transformers_models():
    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)
        for builder in (tm.gpt2, tm.llama, tm.bert, tm.vit, tm.t5):
            compile_regional(builder(n_layer=3), backend="eager")


# --- errors ------------------------------------------------------------------------------------


def test_error_no_repeated_blocks_says_how_to_pass_blocks():
    model = nn.Sequential(nn.Linear(4, 4), Block(4))
    with pytest.raises(NoRepeatedBlocksError, match=r"blocks=MyLayer") as err:
        compile_regional(model)
    assert isinstance(err.value, ValueError)


def test_error_selector_matches_nothing():
    with pytest.raises(BlockSelectorError, match=r"'NoSuchLayer' matches no module.*Block"):
        compile_regional(Stack(), blocks="NoSuchLayer")
    with pytest.raises(BlockSelectorError, match="must be a dict"):
        compile_regional(Stack(), blocks={"Block": "max-autotune"})
    with pytest.raises(BlockSelectorError, match="overlap"):
        find_repeated_blocks(Stack(), blocks={"layers": {}, "Block": {}})


def test_error_not_a_module():
    with pytest.raises(TypeError, match="must be a torch.nn.Module, got dict"):
        compile_regional({"not": "a model"})


def test_error_whole_model_wrapper():
    with pytest.raises(ValueError, match="_orig_mod"):
        compile_regional(torch.compile(Stack(), backend="eager"))


# --- other modules and the loss --------------------------------------------------------------

EVERY_MODULE = [
    "transformer.h.*",
    "transformer.wte",
    "transformer.wpe",
    "transformer.ln_f",
    "lm_head",
]
"""The blocks and every other module with parameters (what ``remainder=True`` did before it went).
"""


def test_a_blocks_list_compiles_other_modules_as_regions_and_the_loss():
    model = tm.gpt2()
    counter = CompileCounter()
    compile_regional(model, backend=counter, blocks=EVERY_MODULE)
    plan = get_regional_plan(model)
    assert sorted(name for g in plan.groups for name in g.names) == sorted(
        ["transformer.h.0", "transformer.h.1", *EVERY_MODULE[1:]]
    )
    assert plan.eager == ["transformer.drop"]  # no parameters: left eager
    out = model(**tm.token_batch())
    out.loss.backward()
    # blocks 1 + wte, wpe, ln_f, lm_head 4 + loss 1
    assert counter.frame_count == 6
    uncompile(model)
    assert "_loss_function" not in model.__dict__


@pytest.mark.parametrize("builder", [tm.gpt2, tm.llama])
def test_the_loss_is_compiled_by_default_and_compile_loss_false_leaves_it(builder):
    """compile_regional's default compiles a transformers loss (1.2x faster steps with a 32k
    vocabulary, docs/regional.md); compile_loss=False leaves it eager and unpinned."""
    model = builder()
    counter = CompileCounter()
    compile_regional(model, backend=counter)
    assert "_loss_function" in model.__dict__  # pinned: no per-step class-name lookup
    model(**tm.token_batch()).loss.backward()
    assert counter.frame_count == 2  # the blocks' graph and the loss's
    plain, counter = builder(), CompileCounter()
    compile_regional(plain, backend=counter, compile_loss=False)
    assert "_loss_function" not in plain.__dict__
    plain(**tm.token_batch()).loss.backward()
    assert counter.frame_count == 1


def test_fix_loss_function_removes_the_loss_graph_break():
    batch = tm.token_batch()
    plain = tm.gpt2()
    with pytest.raises(torch._dynamo.exc.Unsupported):
        torch.compile(plain, backend="eager", fullgraph=True)(**batch)
    torch._dynamo.reset()
    torch.manual_seed(1)
    fixed = fix_loss_function(tm.gpt2())
    counter = CompileCounterWithBackend("eager")
    out = torch.compile(fixed, backend=counter, fullgraph=True)(**batch)
    assert counter.frame_count == 1
    torch.manual_seed(1)
    torch.testing.assert_close(out.loss, tm.gpt2()(**batch).loss)  # same seed, same weights


def test_fix_loss_function_refuses_non_transformers_models():
    with pytest.raises(ValueError, match="no transformers PreTrainedModel"):
        fix_loss_function(Stack())


def test_whole_transformers_submodels_as_regions_compile_fullgraph():
    """Modular compile (encoder and decoder as regions): the use_cache hook stays outside them.

    A hook on a transformers model *inside* a compiled region is traced by dynamo, and its rewrite
    of the call's kwargs broke a fullgraph trace ("mapping proxy affected by dictionary mutation").
    """
    model = tm.vision_encoder_decoder()
    reference = copy.deepcopy(model)
    counter = CompileCounterWithBackend("aot_eager")
    compile_regional(model, blocks={"encoder": {}, "decoder": {}}, backend=counter, fullgraph=True)
    pixel_values = torch.randn(2, 3, 32, 32)
    labels = torch.randint(3, tm.VOCAB, (2, 8))
    out = model(pixel_values=pixel_values, labels=labels)
    out.loss.backward()
    expected = reference(pixel_values=pixel_values, labels=labels)
    expected.loss.backward()
    assert counter.frame_count == 2  # one graph per region, no break
    torch.testing.assert_close(out.loss, expected.loss)
    hooked = [n for n, m in model.named_modules() if m._forward_pre_hooks]
    assert hooked == [""]  # only the outer model, outside both regions


# --- declared blocks ------------------------------------------------------------------------------


class _Single(nn.Module):
    def __init__(self, width: int):
        super().__init__()
        self.proj = nn.Linear(width, width)
        self.norm = nn.LayerNorm(width)

    def forward(self, x):
        return x + self.proj(self.norm(x))


class _Dual(_Single):
    def forward(self, x):  # its own code object, as diffusers' block classes have
        return x * 0.5 + self.proj(self.norm(x))


class _DeclaredModel(nn.Module):
    """diffusers' shape: one block of each declared class (as in its tests' tiny configs), and a
    GELU-like leaf pair that discovery alone would take as blocks."""

    _repeated_blocks = ("_Single", "_Dual")  # diffusers uses a list; any sequence of names

    def __init__(self):
        super().__init__()
        self.inp = nn.Linear(8, 16)
        self.single_blocks = nn.ModuleList([_Single(16)])
        self.dual_blocks = nn.ModuleList([_Dual(16)])
        self.acts = nn.ModuleList([nn.Sequential(nn.Linear(16, 16), nn.GELU()) for _ in range(2)])
        self.out = nn.Linear(16, 4)

    def forward(self, x):
        x = self.inp(x)
        for block in [*self.single_blocks, *self.dual_blocks]:
            x = block(x)
        for act in self.acts:
            x = act(x)
        return self.out(x)


def test_declared_blocks_are_exactly_what_is_compiled_also_when_a_class_occurs_once():
    """compile_regional ignored diffusers' _repeated_blocks: it compiled other repeated modules
    (two GELUs of different lengths on Flux) or found none (LTX: one block)."""
    model = _DeclaredModel()
    plan = find_repeated_blocks(model)
    assert [(g.class_name, g.names, g.selector) for g in plan.groups] == [
        ("_Single", ["single_blocks.0"], "declared: _repeated_blocks"),
        ("_Dual", ["dual_blocks.0"], "declared: _repeated_blocks"),
    ]
    assert "1 × _Single (declared: _repeated_blocks)" in plan.summary()
    counter = CompileCounter()
    with torch._dynamo.config.patch(recompile_limit=1):  # diffusers' tests run under a limit
        compile_regional(model, backend=counter, fullgraph=True)
        model(torch.randn(2, 3, 8)).sum().backward()
        model(torch.randn(2, 3, 8)).sum().backward()
    assert counter.frame_count == 2  # one graph per declared class, reused
    # a selector still wins over the declaration, and an undeclared model is discovered
    assert [g.selector for g in find_repeated_blocks(_DeclaredModel(), "acts.*").groups] == [
        "acts.*"
    ]
    assert {g.selector for g in find_repeated_blocks(tm.gpt2()).groups} == {"discovered"}


def test_a_cuda_graph_mode_on_a_cpu_model_says_what_runs_at_its_first_call():
    """Said at the first call, from where the model is then (it was said at the compile, which a
    model moved to CUDA afterwards got wrong)."""
    model = tm.gpt2()
    batch = torch.randint(0, 64, (2, 8))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        compile_regional(model, backend="cudagraphs")  # nothing said before it runs
    with pytest.warns(UserWarning, match="no CUDA parameter") as warned:
        model(batch)
    with warnings.catch_warnings(record=True) as again:
        warnings.simplefilter("always")
        model(batch)  # said once
    warned = [*warned, *again]
    said = [str(w.message) for w in warned if "no CUDA parameter" in str(w.message)]
    assert len(said) == 1 and "the captured graph without them" in said[0]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        uncompile(model)
        compile_regional(model, backend="eager")  # the default mode: nothing to say


def _on_cuda(monkeypatch):
    """The model reads as being on CUDA (as after ``.cuda()``): CPU tensors still run the call."""
    from torchcompile_kit.regional import cuda_graphs

    monkeypatch.setattr(cuda_graphs, "model_device", lambda model: torch.device("cuda"))


@pytest.mark.parametrize(
    "kwargs",
    [
        {"mode": "reduce-overhead"},
        {"mode": "max-autotune"},
        {"backend": "cudagraphs"},
        {"options": {"triton.cudagraphs": True}},
        {"blocks": {"transformer.h.*": {"mode": "reduce-overhead"}}},
    ],
)
def test_a_cuda_graph_mode_per_block_is_refused_at_the_first_call_on_cuda(monkeypatch, kwargs):
    """Compiled on CPU, moved to CUDA (``.cuda()``, accelerate's ``prepare``): block i+1 would be
    fed block i's CUDA-graph output, overwritten by its replay (pytorch#152887). Refused before
    anything runs, with the upstream bug and what to use instead."""
    model = tm.gpt2()
    compile_regional(model, **kwargs)
    _on_cuda(monkeypatch)
    graphs = torch._dynamo.utils.counters["stats"]["unique_graphs"]
    with pytest.raises(UnsafeCompileModeError, match="152887") as refused:
        model(torch.randint(0, 64, (2, 8)))
    assert "compile_model(model" in str(refused.value)
    assert "max-autotune-no-cudagraphs" in str(refused.value)
    assert torch._dynamo.utils.counters["stats"]["unique_graphs"] == graphs  # nothing compiled


def test_a_cuda_graph_mode_on_a_model_already_on_cuda_is_refused_at_the_call(monkeypatch):
    model = tm.gpt2()
    _on_cuda(monkeypatch)
    with pytest.raises(UnsafeCompileModeError, match="152887"):
        compile_regional(model, mode="reduce-overhead")
    assert not _dynamo.compiled_module_names(model) and get_regional_plan(model) is None


def test_cuda_graphs_over_the_whole_model_stay_allowed_on_cuda(monkeypatch):
    """The supported shape (the bench's ``reduce-overhead`` row): no refusal, no CPU note."""
    model = tm.gpt2()
    compile_model(model, backend="cudagraphs")
    _on_cuda(monkeypatch)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        model(torch.randint(0, 64, (2, 8)))
    uncompile(model)
    assert not _dynamo.compiled_module_names(model)


# --- stage-structured models ---------------------------------------------------------------------


class _Res(nn.Module):
    def __init__(self, width: int):
        super().__init__()
        self.norm = nn.LayerNorm(width)
        self.proj = nn.Linear(width, width)

    def forward(self, x):
        return x + self.proj(self.norm(x))


class _Stage(nn.Module):
    """A UNet down stage: two residual blocks of its width, then a change of width."""

    def __init__(self, width: int, out: int):
        super().__init__()
        self.res = nn.ModuleList([_Res(width), _Res(width)])
        self.resize = nn.Linear(width, out)

    def forward(self, x):
        for block in self.res:
            x = block(x)
        return self.resize(x)


class _StageModel(nn.Module):
    def __init__(self):
        super().__init__()
        self.stages = nn.ModuleList([_Stage(8, 16), _Stage(16, 32), _Stage(32, 8)])

    def forward(self, x):
        for stage in self.stages:
            x = stage(x)
        return x


def test_discovery_does_not_take_stages_of_different_widths_as_blocks():
    """It took the UNet's down/up stages as blocks: one graph per stage, reused by nothing."""
    model = _StageModel()
    plan = find_repeated_blocks(model)
    assert [(g.class_name, len(g.names)) for g in plan.groups] == [("_Res", 6)]
    assert plan.groups[0].selector == (
        "discovered inside the stages _Stage (3 of different widths), each its own graph"
    )
    counter = CompileCounter()
    compile_regional(model, backend=counter)
    (group,) = get_regional_plan(model).groups
    x = torch.randn(2, 8)
    torch.testing.assert_close(model(x), _StageModel_reference(model)(x))
    # one graph per width, reused by the stage's 2 blocks; the first block's input needs no
    # grad while every later one's does: one more at width 8 (predicted, and measured)
    assert counter.frame_count == group.preflight.graphs == 4


def _StageModel_reference(model):
    twin = _StageModel()
    twin.load_state_dict(model.state_dict())
    return twin


def test_stages_of_one_width_stay_blocks():
    """Stages that share their shapes are blocks as before (a graph reused by all of them)."""
    model = nn.Sequential(nn.Linear(8, 8), nn.ModuleList([_Stage(8, 8), _Stage(8, 8)]))
    plan = find_repeated_blocks(model)
    assert [(g.class_name, len(g.names), g.selector) for g in plan.groups] == [
        ("_Stage", 2, "discovered")
    ]


def test_swin_stages_named_in_no_split_modules_give_way_to_their_layers():
    """transformers' Swin names SwinStage (stages of different widths) in _no_split_modules."""
    from transformers import SwinConfig, SwinModel

    model = SwinModel(
        SwinConfig(
            image_size=32,
            patch_size=4,
            embed_dim=16,
            depths=[2, 2, 2],
            num_heads=[2, 2, 4],
            window_size=2,
        )
    )
    assert "SwinStage" in model._no_split_modules
    (group,) = find_repeated_blocks(model).groups
    assert (group.class_name, len(group.names)) == ("SwinLayer", 6)
    assert group.selector.startswith("discovered inside the stages SwinStage (3 of different")


def test_a_no_split_hint_outside_transformers_finds_blocks_no_container_holds():
    """``_no_split_modules`` names a model's blocks in transformers and diffusers alike: read on
    any module, it finds blocks held as plain attributes (no ModuleList)."""

    class Twice(nn.Module):
        _no_split_modules = ("Block",)

        def __init__(self):
            super().__init__()
            self.first, self.second, self.head = Block(), Block(), nn.Linear(8, 2)

        def forward(self, x):
            return self.head(self.second(self.first(x)))

    plan = find_repeated_blocks(Twice())
    assert plan.blocks == ["first", "second"] and plan.eager == ["head"]
