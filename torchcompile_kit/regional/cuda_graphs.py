"""CUDA-graph modes (``mode="reduce-overhead"`` or ``"max-autotune"``, ``backend="cudagraphs"``,
``options={"triton.cudagraphs": True}``) in the library's compile recipes, decided at the first
call from the device the model is on then: a model compiled on CPU and moved with ``.cuda()`` or
accelerate's ``prepare`` afterwards is common.

Per region, on CUDA, they are refused: block *i+1* is the same compiled function fed block *i*'s
CUDA-graph output, which its replay can overwrite while that output is still read (pytorch/pytorch
#152887, open: "accessing tensor output of CUDAGraphs that has been overwritten by a subsequent
run"; #160281 is the two-function variant). Measured on an H100 (torch 2.11, 2026-11-27): a plain
training loop of a 2-layer GPT-2 with every block compiled so gave eager's losses; the bug needs a
block's output read after the next block ran (hidden states kept, hooks, residuals outside the
blocks), which the library cannot rule out. No training anchor compiles blocks with CUDA graphs
(torchtitan, torchtune, accelerate and diffusers use the default mode). The whole-model recipe is
the supported shape. On CPU the mode is accepted, and what runs instead is said once. The refusal
can go when #152887 is fixed (tests/gpu/test_compile.py keeps the measured loop).
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Iterable
from typing import Any

import torch
from torch import nn

from .. import _dynamo
from ..errors import UnsafeCompileModeError

__all__ = ["check_cuda_graphs_at_first_call", "cuda_graph_option", "model_device"]

UPSTREAM_BUG = "https://github.com/pytorch/pytorch/issues/152887"


def cuda_graph_option(compile_kwargs: dict[str, Any]) -> str | None:
    """The option of ``compile_kwargs`` that turns CUDA graphs on, as written (``"mode='reduce-
    overhead'"``), or ``None``."""
    mode, backend = compile_kwargs.get("mode"), compile_kwargs.get("backend")
    options = compile_kwargs.get("options") or {}
    if mode in ("reduce-overhead", "max-autotune"):  # max-autotune turns triton.cudagraphs on too
        return f"mode={mode!r}"
    if backend == "cudagraphs":
        return "backend='cudagraphs'"
    if isinstance(options, dict) and options.get("triton.cudagraphs"):
        return "options={'triton.cudagraphs': True}"
    return None


def check_cuda_graphs_at_first_call(
    model: nn.Module, kwargs_sets: Iterable[dict[str, Any]], *, caller: str, per_region: bool
) -> Callable[[], None] | None:
    """Refuse (``per_region``) or accept a CUDA-graph option by the device ``model`` is on.

    Refused at once when the model is on CUDA already; otherwise a check at each call of ``model``
    (a forward pre-hook; ``model``'s own forward runs eagerly in the regional recipe) refuses the
    first call on CUDA, and the first call on CPU says once what runs there. Whole-model recipes
    (``per_region=False``) wrap the compiled call instead, whose hooks run inside the graph.

    Returns:
        The removal of the per-region hook, or ``None`` (no CUDA-graph option, or a whole-model
        recipe: ``uncompile`` clears the wrapped compiled call with the check).

    Raises:
        UnsafeCompileModeError: ``per_region`` and ``model`` is on CUDA now.
    """
    asked = next(filter(None, map(cuda_graph_option, kwargs_sets)), None)
    if asked is None:
        return None
    state = {"said": False}

    def check() -> None:
        device = model_device(model)
        if device.type == "cuda" and per_region:
            raise UnsafeCompileModeError(_refusal(caller, asked))
        if device.type != "cuda" and not state["said"]:
            state["said"] = True
            warnings.warn(_cpu_note(caller, asked), UserWarning, stacklevel=4)

    if per_region:
        if model_device(model).type == "cuda":
            raise UnsafeCompileModeError(_refusal(caller, asked))

        def hook(module: nn.Module, args: tuple) -> None:
            if not torch.compiler.is_compiling():
                check()

        return model.register_forward_pre_hook(hook).remove

    def checked(compiled: Callable[..., Any]) -> Callable[..., Any]:
        def call(*args: Any, **kwargs: Any) -> Any:
            check()
            return compiled(*args, **kwargs)

        return call

    _dynamo.wrap_compiled_call(model, checked)
    return None


def _refusal(caller: str, asked: str) -> str:
    return (
        f"{caller}({asked}) on a CUDA model: CUDA graphs per region feed one region's graph "
        "output into the next region (the same compiled function for the next block), whose "
        "replay can overwrite it while it is still read (kept hidden states, hooks, "
        "residuals): wrong values or the error 'accessing tensor output of CUDAGraphs that "
        f"has been overwritten by a subsequent run' ({UPSTREAM_BUG}, open). "
        "No training recipe compiles blocks with CUDA graphs. Use compile_model(model, "
        f"{asked}) for CUDA graphs over the whole model (one graph), or {caller} with the "
        "default mode (mode='max-autotune-no-cudagraphs' for autotuning without them)."
    )


def _cpu_note(caller: str, asked: str) -> str:
    runs = {
        "mode='reduce-overhead'": "inductor without them, as mode='default'",
        "backend='cudagraphs'": "the captured graph without them (no speed-up)",
    }.get(asked, "inductor without them")
    return (
        f"{caller}({asked}) on a model with no CUDA parameter: {asked} adds CUDA graphs, "
        f"which need CUDA tensors, so here torch runs {runs}. Drop it on CPU."
    )


def model_device(model: nn.Module) -> torch.device:
    """The device of ``model``'s first parameter (the CPU when it has none)."""
    return next((p.device for p in model.parameters()), torch.device("cpu"))
