"""compile_regional(precompile=True): a restart runs the blocks without tracing, and never a stale
graph. Each run is a fresh process with an empty inductor dir; counts, not times, are asserted."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from torchcompile_kit import _dynamo

pytestmark = pytest.mark.skipif(not _dynamo.precompile_supported(), reason="no dynamo precompile cache")

WORKER = Path(__file__).with_name("precompile_worker.py")
REPO = Path(__file__).resolve().parents[2]
BLOCKS = '''
import dataclasses

import torch


@dataclasses.dataclass
class BlockConfig:
    width: int = 16
    scale: float = 2.0


class Block(torch.nn.Module):
    def __init__(self, config):
        super().__init__()
        self.config = config
        self.up = torch.nn.Linear(config.width, config.width)
        self.act = torch.nn.functional.gelu

    def forward(self, x):
        return x + self.act(self.up(x)) * self.config.scale


class Model(torch.nn.Module):
    def __init__(self, config):
        super().__init__()
        self.blocks = torch.nn.ModuleList([Block(config) for _ in range(2)])
        self.head = torch.nn.Linear(config.width, 1)

    def forward(self, x):
        for block in self.blocks:
            x = block(x)
        return self.head(x).pow(2).mean()
'''


def _run(mode: str, model_dir: Path, artifact: Path, variant: str = "") -> dict:
    env = {
        **os.environ,
        "TORCHINDUCTOR_CACHE_DIR": str(artifact.parent / f"inductor-{mode}-{variant or 'plain'}"),
        "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])),
    }
    out = subprocess.run([sys.executable, str(WORKER), mode, str(model_dir), str(artifact), variant],
                         capture_output=True, text=True, env=env, timeout=600, check=False)
    assert out.returncode == 0, out.stdout + out.stderr
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def cold(tmp_path_factory) -> tuple[Path, Path, dict]:
    root = tmp_path_factory.mktemp("precompile")
    (root / "model").mkdir()
    (root / "model" / "tck_blocks.py").write_text(BLOCKS)
    artifact = root / "cc.tck"
    return root / "model", artifact, _run("cold", root / "model", artifact)


@pytest.fixture(scope="module")
def cold_torch_key(cold) -> tuple[Path, dict]:
    """The same cold run, keyed by torch's name-and-line key alone (no fingerprint)."""
    model_dir, artifact, _ = cold
    control = artifact.with_name("torch-key.tck")
    return control, _run("cold", model_dir, control, "torch-key")


def test_the_cold_run_traces_once_and_saves_the_dynamo_entry(cold):
    _, _, result = cold
    assert result["path"] == "traced (saved for the next restart)"
    assert result["dynamo_cache"]["dynamo_cache_miss"] >= 1
    assert result["entries"].get("precompile", 0) >= 1


def test_a_restart_runs_the_blocks_without_a_trace_and_equal_to_the_cold_run(cold):
    model_dir, artifact, first = cold
    warm = _run("warm", model_dir, artifact)
    assert warm["path"] == "precompiled (no trace)"
    assert warm["dynamo_cache"]["dynamo_cache_hit"] == 1 and warm["frames"] == 0
    assert (warm["loss"], warm["grads"]) == (first["loss"], first["grads"])  # bit for bit
    assert warm["warnings"] == []
    assert warm["second_shape_frames"] >= 1  # a new shape after it is traced beside the loaded entry


@pytest.mark.parametrize(("variant", "field"), [("frozen", "parameters"), ("config", "config")])
def test_a_changed_block_is_traced_again_and_the_warning_names_what_changed(cold, variant, field):
    model_dir, artifact, _ = cold
    warm = _run("warm", model_dir, artifact, variant)
    assert warm["path"].startswith("traced again") and field in warm["path"]
    assert warm["dynamo_cache"]["dynamo_cache_hit"] == 0 and warm["frames"] >= 1
    assert any(field in w for w in warm["warnings"])


def test_a_forward_edited_without_moving_a_line_is_traced_again(cold, tmp_path):
    model_dir, artifact, first = cold
    edited = tmp_path / "model"
    edited.mkdir()
    source = BLOCKS.replace("self.act(self.up(x)) * self.config.scale", "self.act(self.up(x)) / self.config.scale")
    assert source != BLOCKS and source.count("\n") == BLOCKS.count("\n")
    (edited / "tck_blocks.py").write_text(source)
    warm = _run("warm", edited, artifact)
    assert warm["path"].startswith("traced again") and "source" in warm["path"]
    assert warm["frames"] >= 1 and warm["loss"] != first["loss"]  # the edited forward ran


def test_a_swapped_activation_function_is_traced_again_where_torchs_key_alone_runs_the_stale_graph(
    cold, cold_torch_key
):
    model_dir, artifact, first = cold
    warm = _run("warm", model_dir, artifact, "swap")
    assert warm["path"].startswith("traced again") and "attributes" in warm["path"]
    assert warm["frames"] >= 1 and warm["loss"] != first["loss"]
    # the control: the same load keyed by torch's name-and-line key alone (no fingerprint) hits
    # the entry traced with gelu and runs it for the silu blocks: the stale graph, silently (the
    # guard on the function's identity is one dynamo's precompile cache drops)
    control_artifact, control_cold = cold_torch_key
    assert control_cold["loss"] == first["loss"]
    control = _run("warm", model_dir, control_artifact, "swap,torch-key")
    assert control["path"] == "precompiled (no trace)" and control["frames"] == 0
    assert control["loss"] == first["loss"] != warm["loss"]


@pytest.mark.parametrize(
    ("kwargs", "reason"),
    [({"backend": "eager"}, "backend 'eager'"), ({"mode": "max-autotune-no-cudagraphs"}, "mode=")],
)
def test_a_group_that_cannot_be_precompiled_is_compiled_the_usual_way_and_says_why(kwargs, reason):
    import torch

    from torchcompile_kit import compile_regional, get_regional_plan

    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Linear(4, 4))
    with pytest.warns(UserWarning, match="not precompiled"):
        compile_regional(model, blocks=torch.nn.Linear, precompile=True, **kwargs)
    (group,) = get_regional_plan(model).groups
    assert group.precompile_path.startswith("not precompiled") and reason in group.precompile_path
    assert all(_dynamo.is_compiled_module(m) for m in model)  # compiled, with module.compile()


def test_a_transformers_restart_traces_nothing_blocks_and_pinned_loss_alike(tmp_path):
    pytest.importorskip("transformers")
    cold = _run("cold", Path("llama"), tmp_path / "llama.tck")
    assert cold["path"] == "traced (saved for the next restart)" and cold["frames"] >= 2
    warm = _run("warm", Path("llama"), tmp_path / "llama.tck")
    assert warm["path"] == "precompiled (no trace)"
    assert warm["frames"] == 0  # the decoder layers and the compiled loss function: no trace
    assert (warm["loss"], warm["grads"]) == (cold["loss"], cold["grads"])
