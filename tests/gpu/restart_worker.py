"""A fresh process of a warm restart on one device: ``compile_cache`` around
``compile_regional(precompile=True)`` on a GPT-2, three SGD steps. Prints one JSON line.

``python tests/gpu/restart_worker.py cold|warm ARTIFACT DEVICE N_LAYER`` with
``TORCHINDUCTOR_CACHE_DIR`` and ``TRITON_CACHE_DIR`` set to empty folders by the caller (the GPU
test, and ``tools/gpu_check.sh``'s restart phase): cold compiles and saves, warm loads and must
not trace. Reported: each region's path, torch's cache counters, Triton's bundle counters and the
cubins written into ``TRITON_CACHE_DIR``, the first step's seconds, and the losses as exact hex.
"""

from __future__ import annotations

import json
import os
import sys
import time

import torch


def main(mode: str, artifact: str, device_name: str, n_layer: str) -> dict:
    import transformers
    from torch._dynamo.utils import counters

    import torchcompile_kit as tck
    from torchcompile_kit import _dynamo

    device = torch.device(device_name)
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    began = time.perf_counter()
    with tck.compile_cache(artifact, save_on_exit=mode == "cold") as cache:
        torch.manual_seed(0)
        config = transformers.GPT2Config(
            vocab_size=512,
            n_positions=64,
            n_embd=128,
            n_layer=int(n_layer),
            n_head=4,
            resid_pdrop=0.0,
            embd_pdrop=0.0,
            attn_pdrop=0.0,
            bos_token_id=1,
            eos_token_id=2,
        )
        model = tck.compile_regional(
            transformers.GPT2LMHeadModel(config).to(device), precompile=True
        )
        opt = torch.optim.SGD(model.parameters(), lr=0.05)
        losses, step_s = [], []
        for step in range(3):
            ids = torch.randint(0, 512, (8, 64), generator=torch.Generator().manual_seed(step)).to(
                device
            )
            started = time.perf_counter()
            loss = model(input_ids=ids, labels=ids).loss
            loss.backward()
            opt.step()
            opt.zero_grad()
            sync()
            step_s.append(time.perf_counter() - started)
            losses.append(loss.item())
    triton_dir = os.environ.get("TRITON_CACHE_DIR", "")
    cubins = (
        sum(name.endswith(".cubin") for _, _, names in os.walk(triton_dir) for name in names)
        if triton_dir
        else None
    )
    loaded = cache.loaded
    return {
        "mode": mode,
        "device": str(device),
        "loaded": bool(loaded),
        "load_reason": loaded.reason if loaded is not None else "",
        "saved": cache.saved.as_dict() if cache.saved is not None else None,
        "paths": {r["label"]: r["path"] for r in _dynamo.precompiled_regions()},
        "cache_stats": cache.cache_stats(),
        "inductor_counters": {
            k: v
            for k, v in counters["inductor"].items()
            if k.startswith(("triton_bundler", "async_compile", "fxgraph"))
        },
        "cubins_written": cubins,
        "first_step_s": step_s[0],
        "later_step_s": step_s[1:],
        "process_s": time.perf_counter() - began,
        "losses": [float(x).hex() for x in losses],
    }


if __name__ == "__main__":
    print(json.dumps(main(*sys.argv[1:])))
