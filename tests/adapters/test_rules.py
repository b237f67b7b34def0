"""The PEFT x torch.compile rule table: every static rule fires on its trigger and only there.

Nothing here compiles: the decision is what is tested (``describe_peft_model`` on real tiny PEFT
models, then ``evaluate_rules``), including the peft < 0.15 rules against a declared version.
"""

from __future__ import annotations

import dataclasses
import warnings

import pytest
import torch
from peft import (
    LoHaConfig,
    LoKrConfig,
    LoraConfig,
    PromptTuningConfig,
    get_peft_model,
)
from tiny_models import gpt2, opt

from torchcompile_kit import check_peft_compile_safety
from torchcompile_kit.adapters import (
    RULES,
    AdapterFacts,
    describe_peft_model,
    evaluate_rules,
)
from torchcompile_kit.errors import UnsafeAdapterConfigError

pytestmark = [
    pytest.mark.filterwarnings("ignore:fan_in_fan_out:UserWarning"),
    pytest.mark.filterwarnings("ignore:`is_gradient_checkpointing` is deprecated:FutureWarning"),
]


def lora_gpt2(**config):
    config.setdefault("target_modules", ["c_attn"])
    return get_peft_model(gpt2(), LoraConfig(r=4, **config))


def opt_with(config_cls, **config):
    return get_peft_model(opt(), config_cls(r=4, target_modules=["q_proj", "v_proj"], **config))


def with_adapters(n: int):
    model = lora_gpt2()
    for i in range(1, n):
        model.add_adapter(f"extra{i}", LoraConfig(r=4, target_modules=["c_attn"]))
    return model


def quantized(kind: str):
    model = lora_gpt2()
    base = model.get_base_model()
    if kind == "bitsandbytes":
        base.is_loaded_in_4bit = True  # what transformers sets for a bnb 4-bit load
    else:
        base.config.quantization_config = {"quant_method": kind}
    return model


def checkpointing_on_cuda(torch_version: str):
    model = lora_gpt2(lora_dropout=0.1)
    base = model.get_base_model()
    (getattr(base, "activation_checkpointing_enable", None) or base.gradient_checkpointing_enable)()
    facts = describe_peft_model(model, training=True)
    return dataclasses.replace(facts, device_type="cuda"), torch_version


def compiled_in_place():
    model = lora_gpt2()
    model.compile(backend="eager")
    return model


# rule id -> (build the model or facts, describe kwargs, expected ids)
TRIGGERS = {
    "not-peft-model": (gpt2, {}, {"not-peft-model"}),
    "peft-on-compiled-model": (
        lambda: get_peft_model(torch.compile(gpt2()), LoraConfig(r=4, target_modules=["c_attn"])),
        {},
        {"peft-on-compiled-model"},
    ),
    "already-compiled": (lambda: torch.compile(lora_gpt2()), {}, {"already-compiled"}),
    "dora-fullgraph": (lambda: lora_gpt2(use_dora=True), {"fullgraph": True}, {"dora-fullgraph"}),
    "dora-graph-breaks": (lambda: lora_gpt2(use_dora=True), {}, {"dora-graph-breaks"}),
    "lokr-loha-training-fullgraph": (
        lambda: opt_with(LoHaConfig),
        {"training": True, "fullgraph": True},
        {"lokr-loha-training-fullgraph"},
    ),
    "lokr-loha-training-graph-breaks": (
        lambda: opt_with(LoKrConfig),
        {"training": True},
        {"lokr-loha-training-graph-breaks"},
    ),
    "inductor-freezing-training": (
        lora_gpt2,
        {"training": True, "options": {"freezing": True}},
        {"inductor-freezing-training"},
    ),
    "inductor-freezing": (lora_gpt2, {"options": {"freezing": True}}, {"inductor-freezing"}),
    "cuda-dropout-checkpointing": (
        lambda: checkpointing_on_cuda("2.13.0"),
        {},
        {"cuda-dropout-checkpointing"},
    ),
    "many-adapters": (lambda: with_adapters(3), {}, {"many-adapters"}),
    "untested-method": (
        lambda: get_peft_model(
            gpt2(), PromptTuningConfig(task_type="CAUSAL_LM", num_virtual_tokens=4)
        ),
        {},
        {"untested-method"},
    ),
    "target-parameters": (
        lambda: get_peft_model(
            opt(), LoraConfig(r=4, target_modules=[], target_parameters=["q_proj.weight"])
        ),
        {},
        {"target-parameters"},
    ),
    "quantized-base": (lambda: quantized("gptq"), {}, {"quantized-base"}),
}


def fired(build, describe_kwargs) -> set[str]:
    built = build()
    torch_version = None
    if isinstance(built, tuple):  # (facts, declared torch version)
        facts, torch_version = built
    else:
        facts = describe_peft_model(built, **{"training": False, **describe_kwargs})
    findings = evaluate_rules(facts, torch_version=torch_version)
    return {f.rule_id for f in findings}


def test_every_static_rule_has_a_trigger_case():
    static = {r.id for r in RULES if r.stage == "static"}
    assert static == set(TRIGGERS)


@pytest.mark.parametrize("rule_id", sorted(TRIGGERS))
def test_rule_fires_on_its_trigger_only(rule_id):
    build, describe_kwargs, expected = TRIGGERS[rule_id]
    with torch._dynamo.config.patch(recompile_limit=2):  # 3 adapters > limit, for many-adapters
        assert fired(build, describe_kwargs) == expected


def test_plain_lora_fires_nothing():
    assert fired(lora_gpt2, {"training": True}) == set()


def test_cuda_rule_needs_torch_2_13():
    assert fired(lambda: checkpointing_on_cuda("2.12.0"), {}) == set()


def test_freezing_only_matters_for_inductor():
    assert (
        fired(lora_gpt2, {"training": True, "backend": "aot_eager", "options": {"freezing": True}})
        == set()
    )


def test_inductor_config_freezing_is_read_when_options_do_not_say():
    import torch._inductor.config as inductor_config

    with inductor_config.patch(freezing=True):
        assert fired(lora_gpt2, {"training": True}) == {"inductor-freezing-training"}


def test_rule_table_rows_are_complete():
    ids = [r.id for r in RULES]
    assert len(ids) == len(set(ids))
    for rule in RULES:
        assert rule.severity in ("refuse", "warn")
        assert rule.condition and rule.evidence and "{detail}" in rule.message, rule.id


def test_refusal_lists_every_violated_rule():
    model = lora_gpt2(use_dora=True)
    with pytest.raises(UnsafeAdapterConfigError) as info:
        check_peft_compile_safety(model, fullgraph=True, training=True, options={"freezing": True})
    message = str(info.value)
    assert "[dora-fullgraph]" in message and "[inductor-freezing-training]" in message
    assert "2 rule(s) violated" in message
    assert {f.rule_id for f in info.value.findings} == {
        "dora-fullgraph",
        "inductor-freezing-training",
    }
    assert isinstance(info.value, ValueError)


def test_fullgraph_dora_is_refused():
    with pytest.raises(UnsafeAdapterConfigError, match=r"dora-fullgraph"):
        check_peft_compile_safety(lora_gpt2(use_dora=True), fullgraph=True)


def test_freezing_with_training_is_refused():
    with pytest.raises(UnsafeAdapterConfigError, match=r"inductor-freezing-training"):
        check_peft_compile_safety(lora_gpt2(), training=True, options={"freezing": True})


def test_on_violation_warn_and_ignore():
    model = lora_gpt2(use_dora=True)
    with pytest.warns(UserWarning, match=r"dora-fullgraph"):
        findings = check_peft_compile_safety(model, fullgraph=True, on_violation="warn")
    assert [f.rule_id for f in findings] == ["dora-fullgraph"]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        findings = check_peft_compile_safety(model, fullgraph=True, on_violation="ignore")
    assert [f.rule_id for f in findings] == ["dora-fullgraph"]


def test_warn_severity_warns_without_raising():
    with pytest.warns(UserWarning, match=r"\[dora-graph-breaks\]"):
        findings = check_peft_compile_safety(lora_gpt2(use_dora=True))
    assert [(f.rule_id, f.severity) for f in findings] == [("dora-graph-breaks", "warn")]


def test_a_bad_on_violation_is_refused_with_the_value():
    with pytest.raises(ValueError, match="on_violation='raise'"):
        check_peft_compile_safety(lora_gpt2(), on_violation="raise")


@pytest.mark.parametrize(
    "build",
    [
        lambda: opt_with(LoKrConfig),
        lambda: lora_gpt2(target_modules=["wte"]),
        lambda: with_adapters(2),
    ],
    ids=["lokr", "lora-embedding", "two-adapters"],
)
def test_what_peft_s_old_guide_listed_as_broken_is_allowed(build):
    """LoKr, LoRA on embeddings and several adapters match eager on the supported peft (the
    matrix in test_compile.py): nothing refuses or warns about them for inference."""
    assert fired(build, {}) == set()


def test_facts_can_be_declared_directly():
    facts = AdapterFacts(
        model_class="PeftModel",
        peft_types={"a": "LOKR", "b": "LORA"},
        training=True,
        fullgraph=True,
    )
    ids = [f.rule_id for f in evaluate_rules(facts)]
    assert ids == ["lokr-loha-training-fullgraph"]
