"""``--model module:function``: loading a user factory, and the errors for wrong ones."""

from __future__ import annotations

import pytest

from torchcompile_kit.bench.model_spec import (
    ModelSpecError,
    load_model_spec,
    loss_of,
    parse_model_spec,
)

PREFIX = "tests.bench.user_models"


def test_loads_a_factory_and_its_batches():
    spec = load_model_spec(f"{PREFIX}:tiny_lm")
    assert spec.source == f"{PREFIX}:tiny_lm" and spec.lengths is None
    loss = loss_of(spec.model(**spec.make_batch(3)))
    assert loss.ndim == 0 and loss.requires_grad


def test_optional_third_item_is_the_lengths():
    assert load_model_spec(f"{PREFIX}:tiny_lm_with_lengths").lengths == [12] * 64


def test_loads_from_a_file_path(tmp_path):
    path = tmp_path / "factory.py"
    path.write_text("from tests.bench.user_models import tiny_lm as build\n")
    assert load_model_spec(f"{path}:build").model is not None


@pytest.mark.parametrize(
    ("text", "match"),
    [
        ("no_colon", "is not 'module:function'"),
        ("mod:", "is not 'module:function'"),
        ("does_not_exist_xyz:build", "importing 'does_not_exist_xyz' failed with ModuleNotFoundError"),
        (f"{PREFIX}:nope", "has no callable 'nope'"),
        (f"{PREFIX}:raises", r"raises\(\) raised OSError: weights not found"),
        (f"{PREFIX}:returns_model_only", r"returned TinyLM .* must return \(model, make_batch\)"),
        (f"{PREFIX}:make_batch_not_a_dict", r"make_batch\(0\) returned list"),
        ("/no/such/file.py:build", "does not exist"),
    ],
)
def test_wrong_specs_are_clear_errors(text, match):
    with pytest.raises(ModelSpecError, match=match) as info:
        load_model_spec(text)
    assert isinstance(info.value, ValueError)


def test_parse_and_loss_of():
    assert parse_model_spec("a.b:c") == ("a.b", "c")

    class Out:
        loss = 2.0

    assert loss_of(Out()) == 2.0 and loss_of({"loss": 1.0}) == 1.0
    with pytest.raises(ModelSpecError, match="without a loss"):
        loss_of({"logits": 1})
