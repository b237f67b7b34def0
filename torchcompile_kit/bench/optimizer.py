"""Benchmark recipe ``optimizer``: AdamW step time, eager implementations vs compiled ones.

Every variant owns an identical copy of the same parameters (``layers`` × ``Linear(width, width)``,
two tensors each) and the same fixed gradients, so no forward/backward is timed and all variants
take the same steps (the last column checks they end where the eager for-loop ends). Variants:
torch's three eager implementations (``foreach=False``, ``foreach=True``, ``fused=True``) and
:func:`compile_optimizer` with ``impl="step"`` and ``impl="foreach_map"``. Compile time is the
first compiled step, from a true cold start; step time is the median of interleaved steps.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from ..optim import compile_optimizer
from .timing import BenchResult, fresh_compile_state, interleaved_medians, timed

SIZES: dict[str, dict[str, Any]] = {
    # ~20 tensors, 42k params: both inductor compiles take seconds, not minutes
    "small": {"layers": 10, "width": 64, "rounds": 5, "iters": 5},
    # ~200 tensors, ~1M params: the size (100 × Linear(100, 100))
    "full": {"layers": 100, "width": 100, "rounds": 7, "iters": 5},
}
HYPER = {"lr": 1e-3, "weight_decay": 1e-2}

EAGER: dict[str, dict[str, Any]] = {
    "eager for-loop": {"foreach": False},
    "eager foreach": {"foreach": True},
    "eager fused": {"fused": True},
}
COMPILED: dict[str, str] = {
    "compile_optimizer(step)": "step",
    "compile_optimizer(foreach_map)": "foreach_map",
}


def _params(layers: int, width: int, device: torch.device) -> list[torch.nn.Parameter]:
    gen = torch.Generator().manual_seed(0)
    params = []
    for _ in range(layers):
        for shape in ((width, width), (width,)):
            p = torch.nn.Parameter(torch.randn(shape, generator=gen).to(device))
            p.grad = torch.randn(shape, generator=gen).to(device)
            params.append(p)
    return params


def _copy(params: list[torch.nn.Parameter]) -> list[torch.nn.Parameter]:
    copies = []
    for p in params:
        q = torch.nn.Parameter(p.detach().clone())
        q.grad = p.grad.clone()
        copies.append(q)
    return copies


def measure(
    *,
    layers: int,
    width: int,
    rounds: int,
    iters: int,
    backend: str = "inductor",
    device: str | torch.device | None = None,
) -> BenchResult:
    """Time one AdamW step per variant on ``layers`` × ``Linear(width, width)`` parameters.

    Args:
        layers: number of linear layers (two parameter tensors each).
        width: their width.
        rounds: interleaved rounds for the step-time medians.
        iters: steps per variant per round.
        backend: ``torch.compile`` backend of the compiled variants (``"aot_eager"`` in tests).
        device: where the parameters live; CUDA when available, else CPU.

    Returns:
        A :class:`BenchResult` with one row per variant.

    Example:
        >>> result = measure(layers=2, width=8, rounds=1, iters=1, backend="aot_eager")
        >>> [row["variant"] for row in result.rows][:2]
        ['eager for-loop', 'eager foreach']
    """
    device = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
    base = _params(layers, width, device)
    params: dict[str, list[torch.nn.Parameter]] = {}
    steps: dict[str, Callable[[], Any]] = {}
    compile_s: dict[str, float | None] = {}
    for name, flags in EAGER.items():
        params[name] = _copy(base)
        steps[name] = torch.optim.AdamW(params[name], **HYPER, **flags).step
        compile_s[name] = None
    with fresh_compile_state():
        for name, impl in COMPILED.items():
            params[name] = _copy(base)
            optimizer = torch.optim.AdamW(params[name], **HYPER)
            steps[name] = compile_optimizer(optimizer, impl=impl, backend=backend).step
            steps[name]()  # the first step initialises state eagerly (compile_optimizer's rule)
            compile_s[name] = timed(steps[name])
        for name in EAGER:  # same number of steps everywhere, so the final params are comparable
            steps[name]()
            steps[name]()
        medians = interleaved_medians(steps, rounds=rounds, iters=iters)
    reference = params["eager for-loop"]
    rows = []
    for name, seconds in medians.items():
        drift = max((a - b).abs().max().item() for a, b in zip(params[name], reference))
        rows.append(
            {
                "variant": name,
                "compile s": compile_s[name],
                "step ms": seconds * 1e3,
                "vs foreach": medians["eager foreach"] / seconds,
                "vs fused": medians["eager fused"] / seconds,
                "max |Δp| vs for-loop": drift,
            }
        )
    fused = medians["eager fused"]
    best = min(COMPILED, key=medians.__getitem__)
    summary = [
        "vs foreach / vs fused: that variant's step time divided by this one's (>1 = faster).",
        (
            f"Fastest compiled variant: {best}, step time {medians[best] / fused:.2f}× fused and "
            f"{medians[best] / medians['eager foreach']:.2f}× foreach."
        ),
        (
            f"GPU target (compiled step time ≤ fused): "
            f"{'met' if medians[best] <= fused else 'missed'} on "
            f"{torch.cuda.get_device_name(device)}."
            if device.type == "cuda"
            else "GPU target (compiled step time ≤ fused): not measured, no GPU in this run."
        ),
    ]
    n_params = sum(p.numel() for p in base)
    return BenchResult(
        recipe="optimizer",
        title=(
            f"AdamW step, {len(base)} tensors / {n_params / 1e6:.2f} M params on {device.type}, "
            f"backend {backend}; compile = first compiled step (cold), step = interleaved median"
        ),
        columns=[
            "variant",
            "compile s",
            "step ms",
            "vs foreach",
            "vs fused",
            "max |Δp| vs for-loop",
        ],
        rows=rows,
        summary=summary,
        config={
            "layers": layers,
            "width": width,
            "rounds": rounds,
            "iters": iters,
            "backend": backend,
            "device": str(device),
            "tensors": len(base),
            "params": n_params,
            **HYPER,
        },
    )


def run(*, size: str = "small") -> BenchResult:
    """The ``torchcompile-kit bench optimizer`` recipe.

    Args:
        size: ``"small"`` (20 tensors, about two minutes on a 2-core CPU including inductor
            compiles) or ``"full"`` (200 tensors, 1.01 M params, as quoted in
            docs/benchmarks.md; each inductor compile takes minutes on CPU).

    Returns:
        A :class:`BenchResult` with one row per variant.

    Example:
        >>> print(format_table(run(size="small")))  # doctest: +SKIP
    """
    return measure(**SIZES[size])
