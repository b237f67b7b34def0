"""The correctness gate: a candidate that computes something else than eager is never recommended.

No error does not mean correct (peft's guide), so every compiled candidate is checked against
eager before it can be recommended, in ``tune``'s own process:

- :func:`~torchcompile_kit.check_compile_equivalence` on a fresh copy of the model, compiled the
  candidate's way (the bench recipe's own ``apply``): outputs, loss, every gradient, every
  parameter after one optimizer step, and the outputs after it;
- with ``compile_optimizer``, the parameters after two steps of the compiled optimizer against
  eager Adam on the same gradients;
- for a PEFT model, :func:`~torchcompile_kit.check_peft_compile_safety` first (a refusal fails).

The check compiles with the candidate's backend, so it costs about one more compile; candidates
that share compiled code (``full``, ``full-warm``, ``mark-dynamic`` ...) share one check.
"""

from __future__ import annotations

import copy
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from .. import _dynamo
from ..adapters import check_peft_compile_safety
from ..bench import RECIPES, RecipeContext, loss_of
from ..diagnostics import CompileMonitor, check_compile_equivalence
from ..optim import compile_optimizer
from .candidates import Candidate

__all__ = ["GateVerdict", "check_candidate"]

_OPTIMIZER_STEPS = 2
_RTOL, _ATOL = 1e-4, 1e-5  # fp32, as check_compile_equivalence's defaults


@dataclass(kw_only=True, slots=True)
class GateVerdict:
    """The outcome of the correctness gate for one compiled code (one ``Candidate.gate``)."""

    ok: bool
    """Every compared tensor is within tolerance (and no PEFT refusal fired)."""
    offending: str | None = None
    """The first failing tensor, with how far off it is, or the error that stopped the check."""
    summary: str = ""
    """What was compared, in a few lines."""
    graph_breaks: int | None = None
    """Distinct graph breaks while compiling the check (``CompileMonitor``)."""
    seconds: float = 0.0
    """Wall seconds the check took."""


def check_candidate(
    candidate: Candidate,
    *,
    model_and_batch: Callable[[], tuple[Any, dict[str, Any]]],
    backend: str,
    overrides: dict[str, Any],
    device: Any,
) -> GateVerdict:
    """Check ``candidate``'s compiled model (and compiled optimizer) against eager.

    Args:
        candidate: a compiled candidate (``candidate.gate`` is not ``None``).
        model_and_batch: builds a fresh ``(model, batch)`` (the user's factory and ``make_batch(0)``).
        backend: the ``torch.compile`` backend the candidate was measured with.
        overrides: the ``torch.compile`` kwargs ``tune`` passed to the recipe.
        device: the device to run on.

    Returns:
        The :class:`GateVerdict`; exceptions while compiling or running become a failed verdict.

    Example:
        >>> verdict = check_candidate(CANDIDATES[2], model_and_batch=build, backend="eager",
        ...                           overrides={}, device="cpu")  # doctest: +SKIP
        >>> verdict.ok, verdict.offending  # doctest: +SKIP
        (True, None)
    """
    started = time.perf_counter()
    _dynamo.reset()
    monitor = CompileMonitor()
    try:
        model, batch = model_and_batch()
        verdict = _peft_refusal(model, backend, overrides)
        if verdict is None:
            with monitor:
                verdict = _equivalence(candidate, model, batch, backend, overrides, device)
            verdict.graph_breaks = monitor.snapshot().get("graph_breaks")
        if verdict.ok and candidate.optimizer == "compiled":
            verdict = _optimizer(model, batch, backend, verdict)
    except Exception as err:  # noqa: BLE001 - a candidate that cannot be checked is not recommended
        verdict = GateVerdict(ok=False, offending=f"{type(err).__name__}: {err}"[:500])
    finally:
        _dynamo.reset()
    verdict.seconds = time.perf_counter() - started
    return verdict


def _peft_refusal(model: Any, backend: str, overrides: dict[str, Any]) -> GateVerdict | None:
    if not hasattr(model, "peft_config"):
        return None
    findings = check_peft_compile_safety(
        model,
        fullgraph=bool(overrides.get("fullgraph", False)),
        training=True,
        backend=backend,
        on_violation="ignore",
    )
    refusals = [f for f in findings if f.severity == "refuse"]
    if not refusals:
        return None
    return GateVerdict(
        ok=False, offending=str(refusals[0]), summary="check_peft_compile_safety refused"
    )


def _equivalence(
    candidate: Candidate,
    model: Any,
    batch: dict[str, Any],
    backend: str,
    overrides: dict[str, Any],
    device: Any,
) -> GateVerdict:
    import torch

    recipe = RECIPES[candidate.recipe]

    def compile_fn(module: Any, **_: Any) -> Any:
        optimizer = torch.optim.Adam(module.parameters(), lr=1e-4)
        ctx = RecipeContext(
            model=module,
            optimizer=optimizer,
            backend=backend,
            overrides=dict(overrides),
            device=device,
        )
        recipe.apply(ctx)
        return ctx.model

    report = check_compile_equivalence(model, batch, backend=backend, compile_fn=compile_fn)
    offending = None
    if report.failures:
        worst = max(report.failures, key=lambda d: d.ratio)
        offending = (
            f"{worst.name}: max_abs={worst.max_abs:.3g}, max_rel={worst.max_rel:.3g} "
            f"({worst.ratio:.3g}x tolerance){' ' + worst.note if worst.note else ''}"
        )
    return GateVerdict(ok=report.ok, offending=offending, summary=report.summary())


def _optimizer(
    model: Any, batch: dict[str, Any], backend: str, verdict: GateVerdict
) -> GateVerdict:
    """Eager Adam vs ``compile_optimizer(Adam)`` on the same gradients, parameter by parameter."""
    import torch

    copies = [copy.deepcopy(model) for _ in range(2)]
    for module in copies:
        module.train()
        loss_of(module(**batch)).backward()
    eager = torch.optim.Adam(copies[0].parameters(), lr=1e-3)
    compiled = compile_optimizer(torch.optim.Adam(copies[1].parameters(), lr=1e-3), backend=backend)
    for _ in range(_OPTIMIZER_STEPS):
        eager.step()
        compiled.step()
    right = dict(copies[1].named_parameters())
    for name, param in copies[0].named_parameters():
        a, b = param.detach().double(), right[name].detach().double()
        if not torch.allclose(b, a, rtol=_RTOL, atol=_ATOL):
            verdict.ok = False
            verdict.offending = (
                f"param_after_compiled_optimizer_step.{name}: max_abs="
                f"{(a - b).abs().max().item():.3g}"
            )
            break
    verdict.summary += (
        f"\ncompile_optimizer(Adam): {_OPTIMIZER_STEPS} steps compared with eager Adam"
    )
    return verdict
