"""The snippet tune prints runs as printed and sets up the recipe it recommends."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from torchcompile_kit import _dynamo
from torchcompile_kit.bench import RECIPES, setup_source
from torchcompile_kit.tuning import CANDIDATES
from torchcompile_kit.tuning.snippet import make_snippet

SPEC = f"{Path(__file__).with_name('models.py')}:build"
SPEC_WITH_OPTIMIZER = f"{Path(__file__).with_name('models.py')}:build_with_optimizer"
BY_NAME = RECIPES


def run_snippet(name: str, tmp_path, monkeypatch, spec=SPEC, **kwargs) -> dict:
    monkeypatch.chdir(tmp_path)  # the warm-restart snippet saves its cache here
    source = make_snippet(BY_NAME[name], spec=spec, backend="eager", steps_planned=2, **kwargs)
    namespace: dict = {"__name__": "snippet"}  # set up only: as a script it would train
    exec(compile(source, f"<snippet {name}>", "exec"), namespace)  # noqa: S102 - the point
    loss = namespace["train_step"](namespace["make_batch"](7))
    assert torch.isfinite(loss)
    namespace["__source__"] = source
    return namespace


@pytest.mark.parametrize(
    ("name", "compiled"),
    [
        ("eager", []),
        ("full", ["<model>"]),
        ("regional", ["blocks.0", "blocks.1"]),
        ("compile-optimizer", ["<model>"]),
        ("fused-adam", ["<model>"]),
        ("mark-dynamic", ["<model>"]),
        ("full-warm", ["<model>"]),
    ],
)
def test_each_snippet_runs_and_applies_its_recipe(name, compiled, tmp_path, monkeypatch):
    namespace = run_snippet(name, tmp_path, monkeypatch)
    names = [n or "<model>" for n in _dynamo.compiled_module_names(namespace["model"])]
    assert names == compiled
    optimizer = namespace["optimizer"]
    assert optimizer.defaults.get("fused") is (True if name == "fused-adam" else None)
    if name == "full-warm":  # (the eager backend leaves no kernels to save; inductor does)
        assert "with compile_cache('compile-cache'):" in namespace["__source__"]


def test_fullgraph_only_without_measured_breaks():
    source = make_snippet(
        BY_NAME["full"], spec="pkg.models:build", steps_planned=9, fullgraph=False
    )
    assert "compile_model(model, fullgraph=False, precompile=True)" in source
    assert "from pkg.models import build" in source and "steps_planned = 9" in source
    source = make_snippet(BY_NAME["regional"], spec="pkg.models:build", steps_planned=9)
    # compile_regional pins and compiles the loss itself (compile_loss=True), as the bench ran it
    assert "fix_loss_function" not in source
    assert "compile_regional(model, fullgraph=True, precompile=True)" in source


@pytest.mark.parametrize("name", CANDIDATES)
def test_the_snippet_holds_the_lines_the_bench_ran(name):
    """One definition: the snippet's setup is the bench's (``apply_recipe`` runs these lines)."""
    recipe = RECIPES[name]
    source = make_snippet(recipe, spec="pkg.models:build", steps_planned=9)
    overrides = {"fullgraph": True} if recipe.compile != "none" else {}
    lines = setup_source(recipe, overrides=overrides)
    assert "\n".join(lines) in source
    assert bool(lines) == (recipe.compile != "none" or recipe.optimizer != "as-is")


@pytest.mark.parametrize("name", ["eager", "full", "compile-optimizer", "fused-adam"])
def test_the_factorys_optimizer_is_kept(name, tmp_path, monkeypatch):
    namespace = run_snippet(
        name, tmp_path, monkeypatch, spec=SPEC_WITH_OPTIMIZER, spec_optimizer=True
    )
    optimizer = namespace["optimizer"]
    assert type(optimizer) is torch.optim.AdamW  # the factory's, not the snippet's Adam
    group = optimizer.param_groups[0]
    assert float(group["lr"]) == 3e-4 and group["weight_decay"] == 0.1
    assert group["fused"] is (True if name == "fused-adam" else None)
    compiled_step = getattr(optimizer.step, "_torchcompile_kit_impl", None)
    assert compiled_step == ("step" if name == "compile-optimizer" else None)
    assert "Adam(" not in namespace["__source__"]
    params = {id(p) for p in namespace["model"].parameters()}
    assert {id(p) for p in group["params"]} == params


def test_a_module_spec_is_imported_from_the_directory_tune_found_it_in():
    source = make_snippet(
        BY_NAME["eager"], spec="mymodels:build", sys_path="/home/me/proj", steps_planned=3
    )
    assert "_MODEL_DIR = '/home/me/proj'" in source
    assert source.index("sys.path.insert(0, _MODEL_DIR)") < source.index(
        "from mymodels import build"
    )
