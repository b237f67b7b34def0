"""``tune``: measure the candidates (:mod:`.candidates`, :mod:`.runs`), check them (:mod:`.gate`),
do the arithmetic (:mod:`.ranking`) and recommend the cheapest eligible one (docs/tune.md);
``check_prediction``: run the recommendation for the planned steps.

Progress goes to the ``torchcompile_kit.tuning`` logger (INFO), one line per candidate.
"""

from __future__ import annotations

import dataclasses
import datetime
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from .._checks import check_positive_int
from .._compat import package_version
from .._moved import refuses_moved
from ..bench import (
    PRESETS,
    RECIPES,
    MeasureConfig,
    ModelSpec,
    ModelSpecError,
    load_model_spec,
    parse_model_spec,
    portable_model_spec,
    spec_buckets,
)
from .budget import Budget, budget_shortfall
from .candidates import CANDIDATES
from .ranking import rank_candidates
from .report import bucket_notes, recommendation_reason
from .result import CandidateResult, PredictionCheck, TuneResult
from .runs import RunPlan, measure_candidate, run_planned
from .snippet import make_snippet

__all__ = ["check_prediction", "tune"]

STEADY_S = 30.0
"""Seconds of steady steps ``tune`` times per candidate unless its ``measure`` says otherwise."""


@refuses_moved
def tune(
    model: str | Callable[[], Any] | None = None,
    *,
    steps_planned: int,
    warm_start: bool = False,
    candidates: Sequence[str] | None = None,
    budget_s: float | None = None,
    measure: MeasureConfig | None = None,
) -> TuneResult:
    """Find the fastest recipe that is still correct for a run of ``steps_planned`` steps.

    Args:
        model: the ``--model`` factory, ``"module:function"`` (or ``"path/file.py:function"``) or a
            module-level function returning ``(model, make_batch[, lengths])``; every candidate's
            fresh process calls it again. ``None``: the bench's captioner.
        steps_planned: the training steps of the planned run: the arithmetic's horizon.
        warm_start: the planned run restarts from a saved compile cache, so the warm restarts are
            ranked; otherwise they are shown as what a restart would cost.
        candidates: names to consider (default: all of :data:`~.candidates.CANDIDATES`).
        budget_s: wall seconds ``tune`` may spend; ``None``: no limit. Candidates that do not fit
            are skipped with the reason.
        measure: how each candidate is measured (``torchcompile_kit.bench.MeasureConfig``);
            ``None``: inductor, the tiny preset's steps, at least :data:`STEADY_S` seconds of steady
            steps, paired with an eager copy.

    Each candidate runs in its own process in a temporary directory, removed on return (a failed
    run's reason ends with the last lines of its log); :func:`~.report.save_result` writes
    ``tune.json``, ``tune.png``, ``recommended.py`` and ``tune.txt``.

    Returns:
        The :class:`TuneResult` (ranked candidates, recommendation, reason, snippet).

    Raises:
        ValueError: a bad argument, an unknown candidate, or a ``model`` spec that does not load.

    Example:
        >>> result = tune("mypkg.models:build", steps_planned=5000, budget_s=1800)  # doctest: +SKIP
        >>> result.recommendation, result.reason  # doctest: +SKIP
        ('regional', 'regional: 1.4x eager per step, pays back its 41 s compile after ~300 ...')
        >>> save_result(result, "tune-out")  # doctest: +SKIP
    """
    check_positive_int("steps_planned", steps_planned)
    measure = MeasureConfig(steady_s=STEADY_S) if measure is None else measure
    if budget_s is not None and not budget_s > 0:
        raise ValueError(f"budget_s must be a positive number of seconds, got {budget_s!r}")
    names = list(CANDIDATES) if candidates is None else list(candidates)
    unknown = [n for n in names if n not in CANDIDATES]
    if unknown:
        raise ValueError(f"unknown candidate(s) {unknown!r}; choose from {list(CANDIDATES)!r}")
    spec = _spec_string(model)
    loaded = load_model_spec(spec) if spec is not None else None  # fails early, with the reason
    budget = Budget(budget_s=budget_s)
    measure = dataclasses.replace(measure, backend=measure.backend or "inductor")
    import torch

    device = torch.device(measure.device_or_default())
    with tempfile.TemporaryDirectory(prefix="tck-tune-") as scratch:  # nothing of it outlives it
        plan = RunPlan(
            spec=spec,
            measure=measure,
            device_type=device.type,
            steps_planned=steps_planned,
            warm_start=warm_start,
            runs=Path(scratch),
        )
        results: list[CandidateResult] = []
        for name in (n for n in CANDIDATES if n in names):
            measure_candidate(RECIPES[name], plan, budget, results)
    ranked, recommended = rank_candidates(results, steps_planned, warm_start=warm_start)
    shortfall = budget_shortfall(results, budget)
    return TuneResult(
        recommendation=recommended.name if recommended else None,
        reason=recommendation_reason(recommended, ranked, steps_planned, shortfall=shortfall),
        snippet=_snippet(recommended, plan, loaded),
        steps_planned=steps_planned,
        candidates=ranked,
        settings=_settings(plan, budget_s, device),
        notes=_notes(loaded, measure.preset, results),
        elapsed_s=budget.elapsed(),
    )


def check_prediction(result: TuneResult) -> PredictionCheck:
    """Run ``result``'s recommendation for its ``steps_planned`` steps in a fresh process, as
    measured (the model spec and measurement settings ``tune`` recorded), and compare the total
    time ``tune`` predicted with the one measured.

    Args:
        result: what :func:`tune` returned, or :meth:`TuneResult.read_json` of a saved
            ``tune.json``.

    Returns:
        A :class:`PredictionCheck`: ``predicted_s``, ``measured_s`` (warm-up, cache load and every
        step), their ``ratio`` and whether the run kept one speed; the caller may keep it as
        ``result.prediction_check`` (saved with the result).

    Raises:
        ValueError: ``result`` has no recommendation.

    Example:
        >>> result = tune("mypkg.models:build", steps_planned=5000)  # doctest: +SKIP
        >>> result.prediction_check = check_prediction(result)  # doctest: +SKIP
    """
    if result.recommendation is None:
        raise ValueError(
            f"check_prediction: the tune result has no recommendation ({result.reason}); there "
            "is nothing to run"
        )
    chosen = result.candidate(result.recommendation)
    settings = result.settings
    with tempfile.TemporaryDirectory(prefix="tck-check-") as scratch:
        plan = RunPlan(
            spec=settings.get("spec"),
            measure=MeasureConfig.from_dict(settings),
            device_type=str(settings.get("device", "cpu")).split(":")[0],
            steps_planned=result.steps_planned,
            warm_start=bool(settings.get("warm_start")),
            runs=Path(scratch),
        )
        return run_planned(chosen, RECIPES[chosen.name], plan)


# --- inputs --------------------------------------------------------------------------------------


def _spec_string(model: str | Callable[[], Any] | None) -> str | None:
    if model is None:
        return None
    if isinstance(model, str):
        parse_model_spec(model)
        return model
    module = getattr(model, "__module__", None)
    qualname = getattr(model, "__qualname__", "")
    if (
        not callable(model)
        or not module
        or module == "__main__"
        or "." in qualname
        or "<" in qualname
    ):
        raise ModelSpecError(
            "tune needs the model factory by name, because every candidate runs "
            f"in a fresh process that calls it again; {model!r} is not a "
            "module-level function of an importable module. Define it at the "
            "top level of a module and pass it (or 'module:function')."
        )
    return f"{module}:{qualname}"


# --- outputs -------------------------------------------------------------------------------------


def _snippet(chosen: CandidateResult | None, plan: RunPlan, loaded: ModelSpec | None) -> str:
    if chosen is None:
        return ""
    # the snippet runs as a script from any directory: a file by its absolute path, a module
    # with the sys.path entry it was imported from here
    spec, sys_path = portable_model_spec(
        plan.spec or "torchcompile_kit.tuning.examples:captioner_tiny"
    )
    return make_snippet(
        RECIPES[chosen.name],
        spec=spec,
        sys_path=sys_path,
        backend=plan.measure.backend,
        fullgraph=chosen.metrics.graph_breaks == 0,
        steps_planned=plan.steps_planned,
        batch_size=PRESETS[plan.measure.preset].batch_size,
        spec_optimizer=loaded is not None and loaded.optimizer is not None,
    )


def _settings(plan: RunPlan, budget_s: float | None, device: Any) -> dict[str, Any]:
    versions = {
        name: str(package_version(name) or "-") for name in ("torch", "transformers", "peft")
    }
    return {
        "model": plan.spec or f"captioner:{plan.measure.preset}",
        "spec": plan.spec,
        **plan.measure.as_dict(),
        "budget_s": budget_s,
        "warm_start": plan.warm_start,
        "device": str(device),
        "versions": versions,
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
    }


def _notes(loaded: ModelSpec | None, preset: str, results: list[CandidateResult]) -> list[str]:
    if loaded is None or not loaded.lengths:
        return []
    ids = loaded.make_batch(0).get("input_ids")
    batch_size = int(ids.shape[0]) if getattr(ids, "ndim", 0) >= 2 else 64
    # the note says what the timed buckets row padded to only when there is such a row
    timed = any(r.name == "buckets" and r.status == "ok" for r in results)
    measured = spec_buckets(loaded.lengths, PRESETS[preset]) if timed else None
    return bucket_notes(loaded.lengths, batch_size, measured)
