"""Declared blocks on real diffusers models (diffusers' own ``test_torch_compile_repeated_blocks``
shape: tiny configs with one block of each class, ``fullgraph=True`` under a recompile limit)."""

from __future__ import annotations

import pytest
import torch

from torchcompile_kit import CompileMonitor, compile_regional
from torchcompile_kit.regional import find_repeated_blocks

diffusers = pytest.importorskip("diffusers", reason="diffusers is in the test extra; not installed")


def _tiny_flux():
    torch.manual_seed(0)
    model = diffusers.FluxTransformer2DModel(
        patch_size=1,
        in_channels=4,
        num_layers=1,
        num_single_layers=1,
        attention_head_dim=16,
        num_attention_heads=2,
        joint_attention_dim=32,
        pooled_projection_dim=32,
        axes_dims_rope=[4, 4, 8],
    )
    generator = torch.Generator().manual_seed(1)
    inputs = {
        "hidden_states": torch.randn(1, 16, 4, generator=generator),
        "encoder_hidden_states": torch.randn(1, 8, 32, generator=generator),
        "pooled_projections": torch.randn(1, 32, generator=generator),
        "timestep": torch.tensor([1.0]),
        "img_ids": torch.randn(16, 3, generator=generator),
        "txt_ids": torch.randn(8, 3, generator=generator),
    }
    return model, inputs


def test_flux_compiles_its_declared_blocks_one_graph_each_under_a_limit_of_one():
    """Failed before: discovery compiled two GELUs of different lengths ->
    FailOnRecompileLimitHit."""
    model, inputs = _tiny_flux()
    plan = find_repeated_blocks(model)
    assert [(g.class_name, len(g.names)) for g in plan.groups] == [
        ("FluxTransformerBlock", 1),
        ("FluxSingleTransformerBlock", 1),
    ]
    with torch.no_grad():
        expected = model(**inputs).sample
    with (
        torch._dynamo.config.patch(recompile_limit=1, fail_on_recompile_limit_hit=True),
        torch.no_grad(),
        CompileMonitor() as monitor,
    ):
        compile_regional(model, backend="eager", fullgraph=True)
        first = model(**inputs).sample
        second = model(**inputs).sample
    assert monitor.snapshot()["graphs"] == 2 and not monitor.recompiles and not monitor.limit_hits
    torch.testing.assert_close(first, expected)
    torch.testing.assert_close(second, expected)


def test_full_size_unet_plan_is_its_16_transformer_blocks():
    """Discovery alone took the down/up stages (different widths) as blocks: a graph per width."""
    with torch.device("meta"):
        model = diffusers.UNet2DConditionModel()
    plan = find_repeated_blocks(model)
    assert [(g.class_name, len(g.names), g.selector) for g in plan.groups] == [
        ("BasicTransformerBlock", 16, "declared: _repeated_blocks")
    ]


def test_an_undeclared_unet_is_not_planned_by_its_stages():
    """Without _repeated_blocks, discovery used to compile the down/up stages (3 widths each)."""
    with torch.device("meta"):
        model = diffusers.UNet2DConditionModel()
    model._repeated_blocks = []
    groups = {g.class_name: g for g in find_repeated_blocks(model).groups}
    assert not {"CrossAttnDownBlock2D", "CrossAttnUpBlock2D", "UpBlock2D", "DownBlock2D"} & set(
        groups
    )
    assert len(groups["Transformer2DModel"].names) == 16
    assert groups["Transformer2DModel"].selector.startswith(
        "discovered inside the stages CrossAttnDownBlock2D (3 of different widths), "
        "CrossAttnUpBlock2D (3 of different widths)"
    )
