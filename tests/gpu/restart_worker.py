"""A fresh process of a warm restart on one device: ``compile_cache`` around
``compile_regional(precompile=True)`` on a GPT-2, three SGD steps. Prints one JSON line.

``python tests/gpu/restart_worker.py cold|warm ARTIFACT DEVICE N_LAYER`` with
``TORCHINDUCTOR_CACHE_DIR`` and ``TRITON_CACHE_DIR`` set to empty folders by the caller (the GPU
test, and ``tools/gpu_check.sh``'s restart phase): cold compiles and saves, warm loads and must
not trace. Reported: each region's path, torch's cache counters, Triton's bundle counters and the
cubins written into ``TRITON_CACHE_DIR``, the first step's seconds, and the losses as exact hex.

``python tests/gpu/restart_worker.py compare DIR DEVICE_TYPE`` (the restart phase) reads
``DIR/cold.json`` and ``DIR/warm.json``, writes ``DIR.json`` (the ratios and both runs) and exits
with :func:`failures`' reasons, the checks the GPU test asserts.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

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


def failures(cold: dict, warm: dict, device_type: str) -> list[str]:
    """What the warm restart got wrong against its cold run (empty: nothing)."""
    stats = warm["cache_stats"]  # dynamo's entries hit: nothing traced, nothing compiled again
    checks = [
        (f"the cold run saved nothing: {cold['saved']}", not (cold["saved"] or {}).get("saved")),
        (f"not loaded: {warm['load_reason']}", not warm["loaded"]),
        (
            f"a region traced again: {warm['paths']}",
            not warm["paths"] or set(warm["paths"].values()) != {"precompiled (no trace)"},
        ),
        (
            f"dynamo's entries missed: {stats}",
            stats["dynamo_cache_hit"] < len(warm["paths"]) or stats["dynamo_cache_miss"] != 0,
        ),
        (f"a cache miss: {stats}", stats["cache_misses"] != 0),
        ("other losses than the cold run's (bit for bit)", warm["losses"] != cold["losses"]),
    ]
    if device_type == "cuda":  # the kernels came back from the artifact, into an empty Triton dir
        counters = warm["inductor_counters"]
        checks += [
            (
                f"no Triton kernel came from the artifact: {counters}",
                not counters.get("triton_bundler_read_and_emit_kernel", 0) > 0,
            ),
            ("no cubin was written into the empty Triton dir", not warm["cubins_written"] > 0),
        ]
    return [why for why, wrong in checks if wrong]


def compare(folder: str, device_type: str) -> None:
    cold, warm = (json.loads(Path(folder, f"{mode}.json").read_text()) for mode in ("cold", "warm"))
    summary = {
        "first_step_warm_over_cold": warm["first_step_s"] / cold["first_step_s"],
        "process_warm_over_cold": warm["process_s"] / cold["process_s"],
        "warm_paths": warm["paths"],
        "warm_cache_stats": warm["cache_stats"],
        "warm_inductor_counters": warm["inductor_counters"],
        "warm_cubins_written": warm["cubins_written"],
        "losses_bit_for_bit": warm["losses"] == cold["losses"],
    }
    print(json.dumps(summary))
    with open(folder.rstrip("/") + ".json", "w") as handle:
        json.dump({**summary, "cold": cold, "warm": warm}, handle, indent=2)
    wrong = failures(cold, warm, device_type)
    sys.exit("restart: " + "; ".join(wrong) if wrong else 0)


if __name__ == "__main__":
    if sys.argv[1] == "compare":
        compare(*sys.argv[2:])
    else:
        print(json.dumps(main(*sys.argv[1:])))
