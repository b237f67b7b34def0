"""``--model module:function``: loading a user factory, and the errors for wrong ones."""

from __future__ import annotations

import sys

import pytest
import torch

from torchcompile_kit.bench.model_spec import (
    ModelSpecError,
    load_model_spec,
    loss_of,
    parse_model_spec,
    portable_model_spec,
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
        (
            "does_not_exist_xyz:build",
            "importing 'does_not_exist_xyz' failed with ModuleNotFoundError",
        ),
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


FACTORIES = """
import torch
from tests.bench.user_models import TinyLM, make_batch


def with_optimizer():
    model = TinyLM()
    return model, make_batch, None, torch.optim.SGD(model.parameters(), lr=0.1)


def foreign_optimizer():
    return TinyLM(), make_batch, None, torch.optim.SGD(TinyLM().parameters(), lr=0.1)


def not_an_optimizer():
    return TinyLM(), make_batch, None, "adam"
"""


def test_optional_fourth_item_is_the_optimizer_on_the_models_parameters(tmp_path):
    path = tmp_path / "factories.py"
    path.write_text(FACTORIES)
    spec = load_model_spec(f"{path}:with_optimizer")
    assert isinstance(spec.optimizer, torch.optim.SGD) and spec.lengths is None
    params = spec.optimizer.param_groups[0]["params"]
    assert [id(p) for p in params] == [id(p) for p in spec.model.parameters()]
    with pytest.raises(ModelSpecError, match="3 of the optimizer's parameters are not the model's"):
        load_model_spec(f"{path}:foreign_optimizer")
    with pytest.raises(ModelSpecError, match="fourth item must be the torch.optim.Optimizer"):
        load_model_spec(f"{path}:not_an_optimizer")
    assert load_model_spec(f"{PREFIX}:tiny_lm").optimizer is None


def test_a_portable_spec_finds_the_module_from_any_directory(tmp_path, monkeypatch):
    package = tmp_path / "proj" / "mypkg_tck"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "models.py").write_text("def build(): pass\n")
    monkeypatch.chdir(tmp_path / "proj")
    monkeypatch.setattr(sys, "path", list(sys.path))
    assert portable_model_spec("mypkg_tck.models:build") == (
        "mypkg_tck.models:build",
        str((tmp_path / "proj").resolve()),
    )
    assert portable_model_spec("mypkg_tck:build")[1] == str((tmp_path / "proj").resolve())
    assert portable_model_spec("mypkg_tck/models.py:build") == (
        f"{(package / 'models.py').resolve()}:build",
        None,
    )
    assert portable_model_spec("json:loads") == ("json:loads", None)  # the interpreter's own
    for name in ("mypkg_tck", "mypkg_tck.models"):
        sys.modules.pop(name, None)
