"""What the PEFT checks say: true for the model they got, and evidence an installed
user can open."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch
from peft import LoraConfig, get_peft_model
from tiny_models import gpt2, llama

from torchcompile_kit import check_peft_compile_safety, compile_peft
from torchcompile_kit.adapters import RULES
from torchcompile_kit.errors import UnsafeAdapterConfigError

DOCS = Path(__file__).resolve().parents[2] / "docs"


@pytest.mark.parametrize("call", [check_peft_compile_safety, compile_peft])
def test_a_model_without_adapters_is_named_for_what_it_is(call):
    with pytest.raises(UnsafeAdapterConfigError) as err:
        call(llama())
    message = str(err.value)
    assert message.startswith(f"{call.__name__}: 'LlamaForCausalLM' is not a PEFT model"), message
    assert "nothing for the PEFT rules to check" in message
    assert "compile_regional(model)" in message and "get_peft_model" in message
    # neither a refusal of something unsafe nor a switch that would make it "safe"
    assert "refusing" not in message and "on_violation" not in message


def test_a_lora_model_still_gets_the_refusal_wording():
    model = get_peft_model(gpt2(), LoraConfig(r=4, target_modules=["c_attn"], use_dora=True))
    with pytest.raises(
        UnsafeAdapterConfigError,
        match=r"(?s)refusing to compile .*\[dora-fullgraph\]"
        r".*on_violation='warn'",
    ):
        check_peft_compile_safety(model, fullgraph=True)


def test_a_runtime_refusal_names_the_operation_not_a_compile():
    model = get_peft_model(gpt2(), LoraConfig(r=4, target_modules=["c_attn"]))
    model = compile_peft(model.eval(), fullgraph=True, backend="eager")
    ids = torch.randint(3, 100, (2, 8))
    with pytest.raises(UnsafeAdapterConfigError) as err:
        model(input_ids=ids, adapter_names=["default", "default"])
    message = str(err.value)
    assert message.startswith("refusing forward() on the compiled PeftModel"), message
    assert "[mixed-batch-fullgraph]" in message and "refusing to compile" not in message


def _without_urls(text: str) -> str:
    return re.sub(r"https?://\S+", "", text)


def _github_anchor(heading: str) -> str:
    """GitHub's anchor for a Markdown heading: lower case, punctuation dropped, spaces to '-'."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def test_evidence_cites_no_test_file_of_this_repository():
    for rule in RULES:
        assert "tests/" not in _without_urls(rule.evidence), (rule.id, rule.evidence)
        assert "test_" not in _without_urls(rule.evidence), (rule.id, rule.evidence)


def test_evidence_anchors_exist_in_the_docs():
    cited = {
        (page, anchor)
        for rule in RULES
        for page, anchor in re.findall(r"docs/(\w+\.md)#([\w-]+)", rule.evidence)
    }
    assert cited, "the rule table cites no docs section"
    for page, anchor in cited:
        headings = [
            line.lstrip("#")
            for line in (DOCS / page).read_text().splitlines()
            if line.startswith("#")
        ]
        anchors = {_github_anchor(h) for h in headings}
        assert anchor in anchors, (page, anchor, sorted(anchors))
