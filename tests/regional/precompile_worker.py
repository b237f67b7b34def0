"""A fresh process for the precompiled-region tests: build, ``compile_regional(precompile=True)``,
one inductor train step; save the cache (cold) or load it first (warm; then a step of another
batch shape). Prints one JSON line.

``python precompile_worker.py cold|warm MODEL_DIR ARTIFACT [VARIANT]``, with
``TORCHINDUCTOR_CACHE_DIR`` set by the test. ``MODEL_DIR`` holds ``tck_blocks.py`` (the test writes,
and edits, it). Variants: ``frozen`` (every block's ``up.bias`` frozen), ``config`` (another
``scale``), ``swap`` (every block's activation function gelu -> silu), ``torch-key`` (combinable: the
region's fingerprint emptied, so torch's key alone decides: the control).
"""

from __future__ import annotations

import hashlib
import json
import sys
import warnings

import torch

import torchcompile_kit as tck
from torchcompile_kit import _dynamo
from torchcompile_kit.regional import compile as regional_compile


def main(mode: str, model_dir: str, artifact: str, variant: str = "") -> dict:
    if model_dir == "llama":
        return _llama(mode, artifact)
    sys.path.insert(0, model_dir)
    import tck_blocks

    if "torch-key" in variant:
        regional_compile.region_fingerprint = lambda module, kwargs: {}
    if mode == "warm":
        tck.load_compile_cache(artifact)
    torch.manual_seed(0)
    model = tck_blocks.Model(tck_blocks.BlockConfig(scale=3.0 if variant == "config" else 2.0))
    for block in model.blocks:
        if variant == "frozen":
            block.up.bias.requires_grad_(False)
        if "swap" in variant:
            block.act = torch.nn.functional.silu
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        tck.compile_regional(model, precompile=True)
        with tck.CompileMonitor() as monitor:
            loss = model(torch.randn(4, 16, generator=torch.Generator().manual_seed(1)))
            loss.backward()
    (group,) = tck.get_regional_plan(model).groups
    grads = b"".join(p.grad.numpy().tobytes() for p in model.parameters() if p.grad is not None)
    result = {
        "path": group.precompile_path,
        "frames": len(monitor.frames),
        "dynamo_cache": _dynamo.dynamo_cache_counters(),
        "loss": loss.item(),
        "grads": hashlib.sha256(grads).hexdigest(),
        "warnings": [str(w.message) for w in caught if "compile cache" in str(w.message)],
    }
    if mode == "warm" and not variant:  # a new shape after a precompiled start: a trace beside it
        with tck.CompileMonitor() as again:
            model(torch.randn(7, 16)).backward()
        result["second_shape_frames"] = len(again.frames)
    if mode == "cold":
        saved = tck.save_compile_cache(artifact)
        result["entries"] = saved.mega_cache_entries
    return result


def _llama(mode: str, artifact: str) -> dict:
    """A tiny transformers Llama: its blocks and its pinned loss are precompiled regions."""
    import transformers

    if mode == "warm":
        tck.load_compile_cache(artifact)
    torch.manual_seed(0)
    config = transformers.LlamaConfig(
        vocab_size=128, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=32, use_cache=False,
    )
    model = tck.compile_regional(transformers.LlamaForCausalLM(config), precompile=True)
    ids = torch.randint(0, 128, (2, 8), generator=torch.Generator().manual_seed(1))
    with tck.CompileMonitor() as monitor:
        loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
    grads = b"".join(p.grad.numpy().tobytes() for p in model.parameters() if p.grad is not None)
    result = {
        "path": tck.get_regional_plan(model).groups[0].precompile_path,
        "frames": len(monitor.frames),
        "loss": loss.item(),
        "grads": hashlib.sha256(grads).hexdigest(),
    }
    if mode == "cold":
        tck.save_compile_cache(artifact)
    return result


if __name__ == "__main__":
    print(json.dumps(main(*sys.argv[1:])))
