"""First-call check cost: the first compiled training step with verify on vs off (a script, not a
test).

    python tests/diagnostics/measure_first_call.py RECIPE ARCH BACKEND on|off

RECIPE: model | regional | peft | optimizer; ARCH: gpt2 | llama (tests/tiny_models.py, 2 layers,
hidden 32); BACKEND: aot_eager | inductor. Run each in a fresh process (a cold inductor cache is
made per run); prints one JSON line: the first step's seconds and the monitor's first-call checks
(check seconds vs compiled-call seconds). docs/regional.md, peft.md and optimizer.md quote it.
"""

import json
import os
import sys
import tempfile
import time
import warnings

os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", tempfile.mkdtemp())  # cold: before torch
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
warnings.filterwarnings("ignore")

import torch
from tiny_models import gpt2, llama

from torchcompile_kit import (
    CompileMonitor,
    compile_model,
    compile_optimizer,
    compile_peft,
    compile_regional,
)

recipe, arch, backend, verify = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4] == "on"
build = {"gpt2": gpt2, "llama": llama}[arch]
ids = torch.randint(3, 128, (4, 64), generator=torch.Generator().manual_seed(0))
batch = {"input_ids": ids, "labels": ids}
warm = build()
warm(**batch).loss.backward()  # lazy imports, first-call inits: not the check's
model = build()
if recipe == "peft":
    from peft import LoraConfig, get_peft_model

    target = ["c_attn"] if arch == "gpt2" else ["q_proj", "v_proj"]
    model = get_peft_model(model, LoraConfig(r=4, target_modules=target))
with CompileMonitor() as mon:
    if recipe == "optimizer":
        opt = compile_optimizer(
            torch.optim.AdamW(model.parameters(), lr=1e-3), backend=backend, verify=verify
        )
        model(**batch).loss.backward()
        opt.step()  # eager first step (state init)
        t0 = time.perf_counter()
        opt.step()
        t = time.perf_counter() - t0
    else:
        if recipe == "model":
            compile_model(model, backend=backend, verify=verify)
        elif recipe == "regional":
            compile_regional(model, backend=backend, verify=verify)
        else:
            compile_peft(model, backend=backend, verify=verify)
        t0 = time.perf_counter()
        model(**batch).loss.backward()
        t = time.perf_counter() - t0
checks = [c.as_dict() for c in mon.first_call_checks]
print(
    json.dumps(
        {
            "recipe": recipe,
            "arch": arch,
            "backend": backend,
            "verify": verify,
            "first_step_s": round(t, 3),
            "checks": checks,
            "torch": torch.__version__,
        }
    )
)
