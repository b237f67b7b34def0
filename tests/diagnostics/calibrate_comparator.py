"""The comparator on healthy and planted compiles: how much of its allowance each check uses
(a script, not a test; docs/diagnostics.md quotes it).

    python tests/diagnostics/calibrate_comparator.py BACKEND [SEEDS]

BACKEND: ``inductor`` (healthy), ``perturbed_forward`` or ``perturbed_backward``
(``tests/miscompute.py``: +1e-2 on a graph's outputs). For GPT-2, Llama, BERT (2 layers, hidden 64)
and a small conv net, in fp32 and under bf16 autocast, one batch per seed (shapes vary with it): a
forward and backward eagerly, at the reference precision (float64, or float32 for bf16) and
compiled whole, judged with ``judge_trees``; prints a line per check (its worst tensor's share of
the allowance, at most 1 passes; how many tensors were rounding-level near eager, and of those how
many the reference rule alone would have failed) and a JSON summary line: the largest share the
reference rule gave any tensor, the largest and smallest worst share of a check, and those two
counts.
"""

from __future__ import annotations

import copy
import json
import os
import sys
import time
import warnings

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
warnings.filterwarnings("ignore")

import torch
from miscompute import perturbed_backward, perturbed_forward
from tiny_models import bert, gpt2, llama
from torch import nn

from torchcompile_kit.diagnostics.comparator import judge_trees
from torchcompile_kit.diagnostics.reference import at_precision, cast_floating


class ConvNet(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.body = nn.Sequential(
            nn.Conv2d(3, 16, 3, padding=1),
            nn.BatchNorm2d(16),
            nn.ReLU(),
            nn.Conv2d(16, 32, 3, padding=1),
            nn.GELU(),
            nn.AdaptiveAvgPool2d(1),
        )
        self.head = nn.Linear(32, 10)

    def forward(self, x: torch.Tensor, labels: torch.Tensor) -> dict[str, torch.Tensor]:
        logits = self.head(self.body(x).flatten(1))
        return {"logits": logits, "loss": nn.functional.cross_entropy(logits, labels)}


def _tokens(seed: int) -> dict[str, torch.Tensor]:
    ids = torch.randint(
        3, 128, (2 + seed % 3, 16 + 8 * seed), generator=torch.Generator().manual_seed(seed)
    )
    return {"input_ids": ids, "labels": ids}


def _images(seed: int) -> dict[str, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    return {
        "x": torch.randn(4, 3, 8, 8, generator=generator),
        "labels": torch.randint(0, 10, (4,), generator=generator),
    }


MODELS = {
    "gpt2": (lambda: gpt2(2, 64), _tokens),
    "llama": (lambda: llama(2, 64), _tokens),
    "bert": (lambda: bert(2, 64), _tokens),
    "conv": (ConvNet, _images),
}


def _step(model: nn.Module, batch: dict[str, torch.Tensor], autocast: bool) -> dict[str, object]:
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
        out = model(**batch)
    out = {"logits": out["logits"], "loss": out["loss"]}  # not the KV cache
    named = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    grads = torch.autograd.grad(out["loss"], [p for _, p in named], allow_unused=True)
    return {
        "output": {k: v.detach() for k, v in out.items()},
        "grad": {n: g for (n, _), g in zip(named, grads) if g is not None},
    }


def main(backend_name: str, seeds: int) -> None:
    backend = {
        "perturbed_forward": perturbed_forward,
        "perturbed_backward": perturbed_backward,
    }.get(backend_name, backend_name)
    worsts: list[float] = []
    by_rule: list[float] = [0.0]  # the share of the allowance of every tensor the rule judged
    shortcut = [0, 0]  # tensors passed as near eager; of them, the rule alone would fail
    for seed in range(1, seeds + 1):
        for name, (build, batches) in MODELS.items():
            for autocast in (False, True):
                started = time.perf_counter()
                torch.manual_seed(0)
                model, batch = build(), batches(seed)
                eager = _step(model, batch, autocast)
                dtype = torch.float32 if autocast else torch.float64
                with at_precision(model, dtype):
                    exact = _step(model, cast_floating(batch, dtype), autocast=False)
                compiled_model = copy.deepcopy(model)
                compiled_model.compile(backend=backend)
                compiled = _step(compiled_model, batch, autocast)
                torch._dynamo.reset()
                diffs = judge_trees("", eager, compiled, exact, reference_dtype=str(dtype)[6:])
                worst = max(diffs, key=lambda d: d.ratio)
                worsts.append(worst.ratio)
                near = [d for d in diffs if d.judged_by == "eager"]
                by_rule += [d.ratio for d in diffs if d.judged_by == "reference"]
                # a tensor the shortcut passed that the rule alone would not (typical error aside)
                overruled = [
                    d for d in near if d.compiled_error > d.factor * d.eager_error + d.floor
                ]
                shortcut[0] += len(near)
                shortcut[1] += len(overruled)
                print(
                    f"{name:5s} {'bf16' if autocast else 'fp32'} seed {seed}: {len(diffs)} "
                    "tensors, "
                    f"{sum(not d.ok for d in diffs)} wrong, {len(near)} near eager "
                    f"({len(overruled)} the rule alone would fail), worst {worst.ratio:.3g} of the "
                    f"allowance ({worst.name}, {worst.judged_by}) "
                    f"[{time.perf_counter() - started:.0f} s]",
                    flush=True,
                )
    # healthy: the largest share the rule gave any tensor (< 1 passes; a near-eager tensor's
    # share is of the 16-epsilon band, and beyond it the rule decides); planted: the smallest worst
    # share of a check (> 1 is caught)
    print(
        json.dumps(
            {
                "backend": backend_name,
                "checks": len(worsts),
                "largest_by_rule": max(by_rule),
                "largest": max(worsts),
                "smallest": min(worsts),
                "near_eager": shortcut[0],
                "rule_would_fail": shortcut[1],
                "torch": torch.__version__,
            }
        )
    )


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else 3)
