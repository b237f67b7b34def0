"""Benchmark recipe ``regional``: cold compile and steady step of eager, full and regional compile.

For each depth, every variant starts from the same random GPT-2 (built from a config) and a true
cold start (``torch._dynamo.reset()`` and an empty inductor cache directory). Cold compile time
is the first forward+backward; steady step time is the median of interleaved forward+backward
steps after warm-up. The *floor* is one block compiled alone with the inputs the model gives
it: regional compilation cannot be cheaper than that, since one graph serves every block.

All variants use ``fix_loss_function`` so the full-model compile is not handicapped by the loss
graph break.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from ..regional import compile_regional, fix_loss_function
from .timing import BenchResult, fresh_compile_state, interleaved_medians, timed

SIZES: dict[str, dict[str, Any]] = {
    "small": {"layers": (4,), "hidden": 64, "batch": 2, "seq": 32, "rounds": 3, "iters": 3},
    "full": {"layers": (12, 24), "hidden": 256, "batch": 4, "seq": 64, "rounds": 5, "iters": 5},
}


def _gpt2(layers: int, hidden: int) -> nn.Module:
    from transformers import GPT2Config, GPT2LMHeadModel

    config = GPT2Config(
        vocab_size=1024,
        n_positions=256,
        n_embd=hidden,
        n_layer=layers,
        n_head=hidden // 64 if hidden >= 128 else 2,
        bos_token_id=1,
        eos_token_id=2,
    )
    torch.manual_seed(0)
    return fix_loss_function(GPT2LMHeadModel(config))


def _batch(batch: int, seq: int) -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(0)
    ids = torch.randint(3, 1024, (batch, seq), generator=gen)
    return {"input_ids": ids, "attention_mask": torch.ones_like(ids), "labels": ids.clone()}


def _train_step(model: nn.Module, batch: dict[str, torch.Tensor]) -> Callable[[], None]:
    def step() -> None:
        model.zero_grad(set_to_none=True)
        model(**batch).loss.backward()

    return step


def _block_alone(model: nn.Module, batch: dict[str, torch.Tensor]) -> Callable[[], None]:
    """One block, compiled alone, called with the arguments the model passes it."""
    block = model.transformer.h[0]
    captured: dict[str, Any] = {}

    def capture(_module: nn.Module, args: tuple, kwargs: dict[str, Any]) -> None:
        captured.update(args=args, kwargs=kwargs)

    handle = block.register_forward_pre_hook(capture, with_kwargs=True)
    with torch.no_grad():
        model(**batch, use_cache=False)
    handle.remove()
    alone = copy.deepcopy(block)
    hidden = captured["args"][0].detach().clone().requires_grad_(True)
    kwargs = captured["kwargs"]

    def step() -> None:
        alone.zero_grad(set_to_none=True)
        out = alone(hidden, *captured["args"][1:], **kwargs)
        (out[0] if isinstance(out, tuple) else out).sum().backward()

    alone.compile()
    return step


VARIANTS: dict[str, Callable[[nn.Module], object]] = {
    "eager": lambda model: None,
    "full": lambda model: model.compile(),
    "regional": compile_regional,
    "regional+remainder": lambda model: compile_regional(model, remainder=True),
}


def run(*, size: str = "small") -> BenchResult:
    """Measure eager / full / regional (+ remainder) / single-block floor at each depth.

    Args:
        size: ``"small"`` (minutes on a 2-core CPU) or ``"full"`` (GPT-2 hidden 256, batch
            4×64, 12 and 24 layers, as quoted in docs/benchmarks.md).

    Returns:
        A :class:`BenchResult` with one row per (layers, variant) and the ratios.
    """
    cfg = SIZES[size]
    batch = _batch(cfg["batch"], cfg["seq"])
    rows: list[dict[str, Any]] = []
    summary: list[str] = []
    for layers in cfg["layers"]:
        cold: dict[str, float] = {}
        steps: dict[str, Callable[[], None]] = {}
        for name, apply in VARIANTS.items():
            model = _gpt2(layers, cfg["hidden"])
            with fresh_compile_state():
                apply(model)
                step = _train_step(model, batch)
                cold[name] = timed(step)
                step()  # one more step: any recompile (grad-mode, shapes) happens here
            steps[name] = step
        with fresh_compile_state():
            cold["block floor"] = timed(_block_alone(_gpt2(layers, cfg["hidden"]), batch))
        medians = interleaved_medians(steps, rounds=cfg["rounds"], iters=cfg["iters"])
        for name, seconds in cold.items():
            rows.append(
                {
                    "layers": layers,
                    "variant": name,
                    "first step s": seconds,
                    "cold / full": seconds / cold["full"],
                    "steady step ms": medians[name] * 1e3 if name in medians else None,
                    "steady / full": medians[name] / medians["full"] if name in medians else None,
                }
            )
        summary.append(
            f"{layers} layers: regional cold = {cold['regional'] / cold['full']:.2f} × full, "
            f"{cold['regional'] / cold['block floor']:.2f} × the one-block floor (target ≤ 1.15); "
            f"steady regional / full = {medians['regional'] / medians['full']:.3f}, "
            f"regional+remainder / regional = {medians['regional+remainder'] / medians['regional']:.3f}"
        )
    return BenchResult(
        recipe="regional",
        title=(
            f"GPT-2 (hidden {cfg['hidden']}, batch {cfg['batch']}×{cfg['seq']}) forward+backward, "
            "inductor; first step = cold compile, steady = interleaved median"
        ),
        columns=["layers", "variant", "first step s", "cold / full", "steady step ms", "steady / full"],
        rows=rows,
        summary=summary,
        config=dict(cfg),
    )
