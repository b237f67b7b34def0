"""check_compile_equivalence on plain modules and PEFT models, with real compiler backends."""

from __future__ import annotations

import warnings

import pytest
import torch
from tiny_models import gpt2, token_batch
from torch import nn

from torchcompile_kit import EquivalenceStep, check_compile_equivalence

pytestmark = [
    pytest.mark.filterwarnings("ignore:fan_in_fan_out:UserWarning"),
    pytest.mark.filterwarnings("ignore:`is_gradient_checkpointing` is deprecated:FutureWarning"),
]


class MLP(nn.Module):
    def __init__(self, width: int = 8, dropout: float = 0.0):
        super().__init__()
        self.up = nn.Linear(width, 2 * width)
        self.down = nn.Linear(2 * width, width)
        self.drop = nn.Dropout(dropout)

    def forward(self, x, scale=None):
        y = self.down(self.drop(torch.relu(self.up(x))))
        return y if scale is None else y * scale


def shifted_backend(shift: float):
    """A compiler backend that rewrites the FX graph: its first floating output gets ``+ shift``."""

    def backend(gm: torch.fx.GraphModule, example_inputs):
        output = next(node for node in gm.graph.nodes if node.op == "output")
        results = list(output.args[0])
        for i, node in enumerate(results):
            value = node.meta.get("example_value") if isinstance(node, torch.fx.Node) else None
            if isinstance(value, torch.Tensor) and value.is_floating_point():
                with gm.graph.inserting_before(output):
                    results[i] = gm.graph.call_function(torch.add, (node, shift))
                break
        output.args = (tuple(results),)
        gm.recompile()
        return gm.forward

    backend.__name__ = f"shifted_{shift:g}"
    return backend


def test_plain_module_matches_and_reports_every_tensor():
    torch.manual_seed(0)
    report = check_compile_equivalence(MLP(), torch.randn(4, 8), backend="aot_eager")
    assert report.ok, report.summary()
    names = {d.name for d in report.diffs}
    assert {
        "output",
        "loss",
        "grad.up.weight",
        "param_after_step.down.bias",
        "output_after_step",
    } <= names
    assert report.notes == []  # not a PEFT model: nothing perturbed
    assert report.worst is not None and report.worst.ratio <= 1
    assert "OK" in report.summary()


def test_inputs_as_tuple_and_dict():
    torch.manual_seed(0)
    x = torch.randn(4, 8)
    scale = torch.tensor(2.0)
    for inputs in [(x, scale), {"x": x, "scale": scale}]:
        report = check_compile_equivalence(MLP(), inputs, backend="eager")
        assert report.ok, report.summary()


def test_perturbing_backend_is_not_ok():
    torch.manual_seed(0)
    report = check_compile_equivalence(MLP(), torch.randn(4, 8), backend=shifted_backend(1e-3))
    assert not report.ok
    assert report.worst.name in {
        "output",
        "output_after_step",
        "loss",
    } or report.worst.name.startswith("grad.")
    assert {"output", "output_after_step"} <= {d.name for d in report.failures}
    output = next(d for d in report.diffs if d.name == "output")
    assert output.max_abs == pytest.approx(1e-3, rel=1e-3)
    assert report.backend == "shifted_0.001"
    assert "NOT OK" in str(report)


@pytest.mark.slow
def test_perturbing_backend_is_not_ok_on_a_peft_model():
    from peft import LoraConfig, get_peft_model

    torch.manual_seed(0)
    model = get_peft_model(gpt2(), LoraConfig(r=4, target_modules=["c_attn"]))
    report = check_compile_equivalence(
        model, token_batch(), backend=shifted_backend(1e-2), check_grads=False
    )
    assert not report.ok
    assert report.worst.name.startswith("output.")


def test_a_shift_rounding_cannot_explain_fails_and_a_given_tolerance_means_what_it_says():
    """1e-6 on an fp32 output is far beyond what fp32 rounding does to it (eager is ~1e-7 from the
    float64 reference): the comparator catches it, where the old fixed fp32 tolerance (atol 1e-5)
    let it pass. A user's rtol/atol replace the rule and are applied as written."""
    torch.manual_seed(0)
    x = torch.randn(4, 8)
    small = shifted_backend(1e-6)
    report = check_compile_equivalence(MLP(), x, backend=small, check_grads=False)
    assert not report.ok
    (diff,) = report.diffs
    assert (diff.judged_by, diff.reference) == ("reference", "float64")
    assert (
        diff.compiled_error > 3 * diff.eager_error
        and "judged against: eager in float64" in report.summary()
    )
    assert check_compile_equivalence(
        MLP(), x, backend=small, check_grads=False, tolerance=(1e-4, 1e-5)
    ).ok
    strict = check_compile_equivalence(
        MLP(), x, backend=small, check_grads=False, tolerance=(0.0, 1e-7)
    )
    assert not strict.ok and strict.diffs[0].judged_by == "tolerance"
    assert "rtol=0.0, atol=1e-07 given" in strict.summary()
    # a float64 model has nothing more precise to run against: the float64 tolerance (1e-7)
    double = check_compile_equivalence(MLP().double(), x.double(), backend=small, check_grads=False)
    assert (
        not double.ok
        and double.reference.dtype is None
        and double.diffs[0].judged_by == "tolerance"
    )
    assert check_compile_equivalence(
        MLP().double(), x.double(), backend=small, check_grads=False, tolerance=(1e-7, 1e-5)
    ).ok


@pytest.mark.slow
def test_a_moved_or_misspelt_keyword_is_refused_with_what_to_pass():
    x = torch.randn(4, 8)
    with pytest.raises(
        TypeError, match=r"rtol=\.\.\.\) was removed: pass tolerance=\(rtol, atol\)"
    ):
        check_compile_equivalence(MLP(), x, backend="eager", rtol=1e-3)
    with pytest.raises(TypeError, match=r"unexpected keyword bakend=.*torch.compile takes"):
        check_compile_equivalence(MLP(), x, bakend="eager")
    with pytest.raises(ValueError, match=r"tolerance=0.1: pass \(rtol, atol\)"):
        check_compile_equivalence(MLP(), x, backend="eager", tolerance=0.1)


def test_untrained_adapter_is_perturbed_so_an_ignoring_compile_fails():
    """A freshly initialised LoRA is the identity: without perturbation, a compiled copy that
    drops the adapter would match eager exactly."""
    from peft import LoraConfig, get_peft_model

    def compile_without_adapters(module, **compile_kwargs):
        module.base_model.disable_adapter_layers()  # the compiled copy ignores the adapter
        module.compile(**compile_kwargs)
        return module

    torch.manual_seed(0)
    model = get_peft_model(gpt2(), LoraConfig(r=4, target_modules=["c_attn"]))
    report = check_compile_equivalence(
        model,
        token_batch(),
        backend="eager",
        compile_fn=compile_without_adapters,
        check_grads=False,
    )
    assert not report.ok
    assert any("perturbed 4 adapter parameters" in note for note in report.notes)
    # the original model is untouched: LoRA B still zero
    assert all(not p.any() for n, p in model.named_parameters() if "lora_B" in n)


def test_dropout_is_off_unless_asked():
    torch.manual_seed(0)
    report = check_compile_equivalence(MLP(dropout=0.5), torch.randn(4, 8), backend="eager")
    assert report.ok, report.summary()


@pytest.mark.parametrize("how", ["torch.compile", "module.compile"])
def test_compiled_model_is_refused(how):
    model = MLP()
    if how == "torch.compile":
        model = torch.compile(model, backend="eager")
    else:
        model.compile(backend="eager")
    with pytest.raises(ValueError, match="compile"):
        check_compile_equivalence(model, torch.randn(2, 8), backend="eager")


def test_not_a_module_is_refused():
    with pytest.raises(TypeError, match="torch.nn.Module"):
        check_compile_equivalence(lambda x: x, torch.randn(2))


# --- sequences of calls --------------------------------------------------------------------------


def _hooked_forward(x):
    """A step that registers a pre-hook on an inner module, as PEFT's adapter_names= does."""

    def add_hook_then_forward(model):
        model.up.register_forward_pre_hook(lambda module, args: (args[0] * 2,))
        with torch.no_grad():
            return model(x)

    return add_hook_then_forward


def test_steps_catch_a_graph_reused_across_a_state_change():
    """dynamo skips hook guards by default: the compiled copy reuses the graph traced before the
    hook existed. A single-call check cannot see it; the sequence names the step."""
    torch.manual_seed(0)
    x = torch.randn(4, 8)
    report = check_compile_equivalence(MLP(), steps=[x, _hooked_forward(x), x], backend="eager")
    assert not report.ok
    assert report.failed_steps == ["1:add_hook_then_forward", "2:forward"]
    assert {d.step for d in report.diffs} == {"0:forward", "1:add_hook_then_forward", "2:forward"}
    assert "first failing step: 1:add_hook_then_forward" in report.summary()

    # the same hook added before the first compiled call is traced: equivalent (after a reset:
    # the graph cached above would otherwise serve this new MLP too, stale in the same way)
    torch._dynamo.reset()
    report = check_compile_equivalence(MLP(), steps=[_hooked_forward(x), x], backend="eager")
    assert report.ok, report.summary()


def test_steps_forward_train_and_callables():
    from torchcompile_kit import EquivalenceStep

    torch.manual_seed(0)
    x = torch.randn(4, 8)
    scale = torch.tensor(3.0)
    steps = [
        EquivalenceStep.forward((x,), name="plain"),
        EquivalenceStep.train((x,)),
        EquivalenceStep.forward((x, scale), name="scaled"),
        lambda model: None,  # nothing to compare is fine
    ]
    report = check_compile_equivalence(MLP(), steps=steps, backend="aot_eager")
    assert report.ok, report.summary()
    names = {d.name for d in report.diffs}
    assert {
        "0:plain",
        "1:train.loss",
        "1:train.grad.up.weight",
        "1:train.param.down.bias",
        "2:scaled",
    } <= names


def test_a_step_that_raises_on_one_side_only_is_not_ok():
    torch.manual_seed(0)
    x = torch.randn(4, 8)

    def raises_when_compiled(model):
        if getattr(model, "_compiled_call_impl", None) is not None:
            raise RuntimeError("refused")
        return model(x)

    def raises_on_both(model):
        raise KeyError("same")

    report = check_compile_equivalence(
        MLP(), steps=[raises_on_both, raises_when_compiled], backend="eager"
    )
    assert report.failed_steps == ["1:raises_when_compiled"]
    assert "only the compiled run raised: RuntimeError: refused" in report.failures[0].note


def test_steps_and_example_inputs_are_exclusive():
    with pytest.raises(ValueError, match="exactly one of example_inputs"):
        check_compile_equivalence(
            MLP(), torch.randn(2, 8), steps=[torch.randn(2, 8)], backend="eager"
        )
    with pytest.raises(ValueError, match="exactly one of example_inputs"):
        check_compile_equivalence(MLP(), backend="eager")


@pytest.mark.slow
def test_a_planted_miscompute_fails_under_bf16_autocast_and_says_what_it_was_judged_against():
    torch.manual_seed(0)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        report = check_compile_equivalence(gpt2(), token_batch(), backend=shifted_backend(1e-1))
    assert not report.ok and report.reference.name == "float32"
    assert "judged against: eager in float32 with autocast off" in report.summary()
    assert any("noise measured" in note for note in report.notes)


@pytest.mark.slow
def test_a_healthy_inductor_compile_is_equal_under_bf16_autocast():
    """GPT-2 compiled whole (Llama, and both regionally, are the first-call check's tests in
    test_first_call.py: this one compiles forward, backward and the optimizer step cold, ~1 min)."""
    torch.manual_seed(0)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        report = check_compile_equivalence(gpt2(n_layer=2, n_embd=64), token_batch())
    assert report.ok and report.reference.name == "float32", report.summary()
    assert any(d.name.startswith("param_after_step.") for d in report.diffs)


class FunctionalDropout(nn.Module):
    """A dropout the check cannot turn off (``training=self.training``, as transformers writes
    its attention dropout), and one it can (a module)."""

    def __init__(self):
        super().__init__()
        self.proj = nn.Linear(8, 8)
        self.drop = nn.Dropout(0.3)

    def forward(self, x):
        return nn.functional.dropout(self.drop(self.proj(x)), 0.3, training=self.training).sum()


def test_random_draws_in_training_are_found_and_drawn_alike_on_both_sides():
    """A training forward that draws random numbers is found by the generator's state moving, and
    the compiled copy then runs with inductor's fallback_random (inductor draws its own numbers
    otherwise: under inductor the gradients of such a model differed, a false miscompute, measured
    in tests/doctor's random control). Without such a draw, nothing is said."""
    torch.manual_seed(0)
    x = torch.randn(4, 8)
    report = check_compile_equivalence(FunctionalDropout(), x, backend="aot_eager")
    assert report.ok and any(note.startswith("random ops:") for note in report.notes), report.notes
    quiet = check_compile_equivalence(MLP(), x, backend="aot_eager")
    assert not any(note.startswith("random ops:") for note in quiet.notes), quiet.notes


# --- a KV cache: regionally compiled blocks run such calls eagerly ------------------------------


def _regional_llama_with_cache():
    from tiny_models import llama

    torch.manual_seed(0)
    model = llama()  # use_cache=True, the config's default
    assert model.config.use_cache
    return model


def test_eval_forwards_of_a_cache_building_model_are_compared_compiled():
    """Regression: with the config's use_cache=True the eval forward built a KV cache, the
    regionally compiled blocks ran it eagerly, and a miscompute in the compiled eval graph was
    reported as 'every tensor passing' (eager against eager)."""
    from torchcompile_kit import compile_regional

    model = _regional_llama_with_cache()
    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)  # no "called to build a KV cache" warning
        report = check_compile_equivalence(
            model,
            token_batch(),
            compile_fn=compile_regional,
            backend=shifted_backend(1e-2),
            check_grads=False,
        )
    assert not report.ok and report.not_compared == []
    assert "output.logits" in {d.name for d in report.failures}, report.summary()


def test_a_step_run_eagerly_on_both_sides_is_not_compared_and_says_so():
    from torchcompile_kit import compile_regional

    batch = token_batch()
    with_cache = EquivalenceStep(
        name="with cache", run=lambda m: m.eval()(**batch, use_cache=True).logits
    )
    without = EquivalenceStep.forward(batch, name="without")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # the regional recipe's KV-cache warning
        report = check_compile_equivalence(
            _regional_llama_with_cache(),
            steps=[with_cache, without],
            compile_fn=compile_regional,
            backend=shifted_backend(1e-2),
        )
    assert report.not_compared == ["0:with cache"]
    assert {d.step for d in report.diffs} == {"1:without"}  # compared: caught
    assert not report.ok
    note = next(n for n in report.notes if n.startswith("not compared: 0:with cache:"))
    assert "LlamaDecoderLayer" in note and "use_cache=False" in note
    only = check_compile_equivalence(
        _regional_llama_with_cache(),
        steps=[with_cache],
        compile_fn=compile_regional,
        backend="aot_eager",
    )
    assert (only.ok, only.diffs) == (False, [])
    assert "NOTHING COMPARED" in only.summary()
