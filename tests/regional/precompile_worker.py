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


if __name__ == "__main__":
    print(json.dumps(main(*sys.argv[1:])))
