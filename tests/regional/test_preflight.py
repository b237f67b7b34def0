"""The guard preflight: precise on transformers' own models, and always checked against dynamo.

Each model here has layers that differ per instance (sliding-window vs full attention, a partial
activation per block). The preflight must not warn where dynamo compiles one graph per block class
(measured with a counting backend), and must say "may" (``Preflight.may_vary``) wherever dynamo
compiled more graphs than it predicted.
"""

from __future__ import annotations

import functools
import warnings

import pytest
import tiny_models as tm
import torch
from torch import nn
from torch._dynamo.testing import CompileCounter

from torchcompile_kit import compile_regional, get_regional_plan
from torchcompile_kit.regional.preflight import find_instance_variants

ALTERNATING = {
    "gemma2": tm.gemma2,
    "qwen2_sliding": tm.qwen2_sliding,
    "gpt_neo": tm.gpt_neo,
    "cohere2": tm.cohere2,
}


@pytest.mark.parametrize("name", sorted(ALTERNATING))
def test_no_false_alarm_on_alternating_attention(name):
    model = ALTERNATING[name]()
    counter = CompileCounter()
    with warnings.catch_warnings():
        warnings.filterwarnings("error", message=".*blocks differ in state")
        compile_regional(model, backend=counter, compile_loss=False)  # the blocks' graphs
    batch = tm.token_batch(length=16)
    model(**batch).loss.backward()
    (group,) = get_regional_plan(model).groups
    assert counter.frame_count >= 1
    # a prediction is either right, or it said "may"
    assert counter.frame_count <= group.preflight.graphs or group.preflight.may_vary, (
        name,
        counter.frame_count,
        group,
    )


def test_gemma2_sliding_window_is_a_may_and_compiles_one_graph(caplog):
    model = tm.gemma2()
    counter = CompileCounter()
    with caplog.at_level("INFO", logger="torchcompile_kit.regional.preflight"):
        compile_regional(model, backend=counter, compile_loss=False)  # the blocks' graphs
    assert any(
        "sliding_window" in r.getMessage() and "may compile one graph per value" in r.getMessage()
        for r in caplog.records
    )  # said before step 1, as "may"
    model(**tm.token_batch(length=16)).loss.backward()
    (group,) = get_regional_plan(model).groups
    assert group.preflight.may_vary == ("self_attn.sliding_window",)
    assert group.preflight.graphs == 1
    assert counter.frame_count == 1  # the measured verdict the old warning contradicted


class Act(nn.Module):
    def __init__(self, style: str):
        super().__init__()
        if style == "partial":
            self.act = functools.partial(nn.functional.gelu, approximate="tanh")  # new object each
        else:
            self.act = self._python_gelu  # a bound method: a new object each

    def _python_gelu(self, x):
        return 0.5 * x * (1 + torch.tanh(0.79788456 * (x + 0.044715 * x**3)))

    def forward(self, x):
        return self.act(x)


class ActBlock(nn.Module):
    def __init__(self, style: str):
        super().__init__()
        self.lin = nn.Linear(8, 8)
        self.act = Act(style)

    def forward(self, x):
        return self.act(self.lin(x))


@pytest.mark.parametrize("style", ["partial", "bound_method"])
def test_per_block_partials_and_bound_methods_are_one_graph(style):
    blocks = nn.Sequential(*[ActBlock(style) for _ in range(4)])
    findings, counts = find_instance_variants(list(blocks))
    assert findings == [] and counts == [(4, 1)]
    counter = CompileCounter()
    with warnings.catch_warnings():
        warnings.filterwarnings("error", message=".*blocks differ in state")
        compile_regional(blocks, backend=counter)
    blocks(torch.randn(2, 8, requires_grad=True))  # every block sees an input that needs grad
    assert counter.frame_count == 1


class PerBlockLambda(nn.Module):
    def __init__(self, scale: float):
        super().__init__()
        self.lin = nn.Linear(8, 8)
        self.fn = lambda x: x * scale  # a distinct function per block, guarded by identity

    def forward(self, x):
        return self.fn(self.lin(x))


def test_distinct_callables_are_still_reported():
    blocks = nn.Sequential(*[PerBlockLambda(float(i)) for i in range(3)])
    findings, counts = find_instance_variants(list(blocks))
    assert [(f.attribute, f.kind, f.certain) for f in findings] == [("fn", "object", True)]
    assert counts == [(3, 3)]


class PassesOn(nn.Module):
    def __init__(self, window):
        super().__init__()
        self.lin = nn.Linear(8, 8)
        self.window = window

    def forward(self, x):
        return _attend(self.lin(x), window=self.window)


def _attend(x, window=None):
    return x if window is None else x * 2


def test_value_handed_on_is_may_and_measured_graphs_are_reported():
    blocks = nn.Sequential(*[PassesOn(8 if i % 2 else None) for i in range(4)])
    findings, counts = find_instance_variants(list(blocks))
    assert [(f.attribute, f.certain) for f in findings] == [("window", False)]
    assert counts == [(4, 1)]  # a "may" does not count as a certain variant
    counter = CompileCounter()
    with warnings.catch_warnings():
        warnings.filterwarnings("error", message=".*blocks differ in state")
        compile_regional(blocks, backend=counter)
    blocks(torch.randn(2, 8, requires_grad=True))
    (group,) = get_regional_plan(blocks).groups
    assert group.preflight.may_vary == ("window",)
    assert counter.frame_count == 2  # _attend branches on it: the "may" was right to be said


def test_torch_nn_transformer_stack_compiles_one_reused_graph_and_matches_eager():
    torch.manual_seed(0)
    layer = nn.TransformerEncoderLayer(32, 4, 64, dropout=0.0, batch_first=True)
    encoder = nn.TransformerEncoder(layer, num_layers=6, enable_nested_tensor=False)
    x = torch.randn(2, 5, 32, requires_grad=True)  # every layer sees an input that needs grad
    expected = encoder(x)
    expected.sum().backward()
    expected_grads = [p.grad.clone() for p in encoder.parameters()]
    encoder.zero_grad()
    counter = CompileCounter()
    compile_regional(encoder, backend=counter)
    assert get_regional_plan(encoder).summary().startswith("compiled 6 × TransformerEncoderLayer")
    out = encoder(x)
    out.sum().backward()
    assert counter.frame_count == 1  # compiled once, reused by all six layers
    torch.testing.assert_close(out, expected)
    for grad, want in zip((p.grad for p in encoder.parameters()), expected_grads):
        torch.testing.assert_close(grad, want)


def test_torch_nn_blocks_compile_with_inductor_and_match_eager():
    torch.manual_seed(0)
    layer = nn.TransformerEncoderLayer(16, 2, 32, dropout=0.0, batch_first=True)
    encoder = nn.TransformerEncoder(layer, num_layers=2, enable_nested_tensor=False).eval()
    x = torch.randn(2, 5, 16)
    with torch.no_grad():
        expected = encoder(x)
        compile_regional(encoder)
        torch.testing.assert_close(encoder(x), expected, rtol=1e-4, atol=1e-4)


# --- frozen and trainable blocks of one class ---------------------------------------------------


def _train_with_eval(model, steps=12):
    """Train with an evaluation under no_grad every 5 steps, as fine-tuning scripts do."""
    optimizer = torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=0.01)
    for step in range(steps):
        model.train()
        model(**tm.token_batch(seed=step)).loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        if step % 5 == 4:
            model.eval()
            with torch.no_grad():  # use_cache=False: compiled (a KV cache would run eagerly)
                model(**tm.token_batch(seed=100), use_cache=False)


@pytest.mark.parametrize(
    ("layers", "frozen", "frozen_embeddings", "train", "evaluation"),
    [
        (2, [0], False, 2, 2),  # the case: block 0 frozen
        (4, [0, 1], False, 2, 2),  # lower half frozen
        (
            3,
            [0],
            True,
            3,
            2,
        ),  # frozen embeddings too: block 1's input needs no grad, block 2's does
    ],
)
def test_frozen_blocks_are_predicted_and_budgeted(
    layers, frozen, frozen_embeddings, train, evaluation
):
    """compile_regional used to predict 1 graph here; dynamo compiled one per requires_grad
    pattern and grad mode, and one more variant would have run eagerly, silently."""
    from torchcompile_kit import CompileMonitor

    torch.manual_seed(0)
    model = tm.gpt2(n_layer=layers)
    if frozen_embeddings:
        model.transformer.wte.requires_grad_(False)
        model.transformer.wpe.requires_grad_(False)
    for index in frozen:
        model.transformer.h[index].requires_grad_(False)
    compile_regional(model, backend="aot_eager")
    (group,) = get_regional_plan(model).groups
    assert (group.preflight.graphs, group.preflight.eval_graphs) == (train, evaluation)
    assert group.budget.needed == train + evaluation <= group.budget.limit
    with CompileMonitor() as monitor:
        _train_with_eval(model)
    report, loss = (
        get_regional_plan(model).report(monitor).groups
    )  # the block group, the loss's row
    assert report.graphs == train + evaluation == report.predicted_graphs, report
    assert not report.flags and not loss.flags and not monitor.limit_hits, (report, loss)


@pytest.mark.slow
def test_more_frozen_patterns_than_the_limit_get_a_sized_limit_and_no_hit():
    """5 blocks, each frozen differently: 10 graphs with evaluation, over the limit of 8."""
    from torchcompile_kit import CompileMonitor

    torch.manual_seed(0)
    model = tm.gpt2(n_layer=5)
    model.transformer.wte.requires_grad_(False)
    model.transformer.wpe.requires_grad_(False)
    parts = ["ln_1", "attn", "ln_2", "mlp"]
    for index, block in enumerate(model.transformer.h):
        for part in parts[:index]:  # block i: its first i parts frozen
            getattr(block, part).requires_grad_(False)
    compile_regional(model, backend="aot_eager")
    (group,) = get_regional_plan(model).groups
    assert group.budget.limit == group.budget.needed == 10  # on every torch of the window
    with CompileMonitor() as monitor:
        _train_with_eval(model)
    report, loss = (
        get_regional_plan(model).report(monitor).groups
    )  # the block group, the loss's row
    assert report.graphs == report.predicted_graphs == 10 and not monitor.limit_hits, report
    assert not loss.flags, loss


def test_the_plan_holds_every_recompile_limit_before_anything_compiles():
    """Deciding, then applying: plan_regional sizes each group's limit and the loss's, and
    compiles nothing; a recompile_limit= the user gave is kept for torch.compile to hold."""
    from torchcompile_kit._dynamo import compiled_module_names, recompile_limit
    from torchcompile_kit.regional.preflight import plan_regional

    model = tm.gpt2()
    plan = plan_regional(model, None, {}, keep_kv_cache=False)
    (group,) = plan.groups
    assert group.budget.limit == group.budget.region_limit == max(recompile_limit(), 2)
    assert plan.loss_limit == recompile_limit()  # one variant, one shape: dynamo's own
    assert group.compiled is None and not compiled_module_names(model)
    given = plan_regional(model, None, {"recompile_limit": 3}, keep_kv_cache=False)
    assert given.groups[0].budget.limit == 3 and given.groups[0].budget.region_limit is None
