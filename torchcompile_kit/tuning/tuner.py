"""``tune``: measure the candidate recipes on the user's model, check them, do the arithmetic.

Each candidate runs from a true cold start in its own process (the bench's
:func:`~torchcompile_kit.bench.run_recipe_isolated`: an empty inductor cache per run; the warm
restarts load the cache their cold run saved). Within the budget:

1. eager runs first: the baseline, and the estimate of what one run costs at least;
2. each compiled candidate runs with a time limit: the budget left, and once a candidate has been
   measured, the time after which it cannot win any more (still warming up when the best
   candidate so far has finished the whole planned run: *pruned*, with the reason);
3. a measured candidate predicted cheaper than every eligible one so far is checked for
   correctness at once (:mod:`.gate`), before the budget goes to the next measurement; at the
   end the rest are checked, cheapest predicted total first, while the budget lasts; a
   candidate that fails, or could not be checked, is never recommended;
4. the cheapest eligible candidate is the recommendation, with the reason and a snippet.
"""

from __future__ import annotations

import datetime
import math
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from .._checks import check_positive_int
from .._compat import package_version
from ..bench import (
    PRESETS,
    RECIPES,
    ModelSpec,
    ModelSpecError,
    batch_stream,
    build_captioner,
    load_model_spec,
    parse_model_spec,
    spec_buckets,
)
from .candidates import CANDIDATES, Candidate, candidate_names
from .gate import check_candidate
from .ranking import rank_candidates
from .report import bucket_notes, format_table, recommendation_reason, write_chart
from .result import CandidateResult, TuneResult
from .runs import OVERRIDES, measure_candidate, verify_run
from .snippet import make_snippet

__all__ = ["tune"]

STEADY_S = 30.0
"""Default seconds of steady steps timed per candidate (see ``tune(steady_s=)``)."""
_GATE_COST = 2.0  # a correctness check costs about this many times the candidate's compile


def tune(
    model: str | Callable[[], Any] | None = None,
    *,
    steps_planned: int,
    budget_s: float | None = None,
    out_dir: str | Path | None = None,
    backend: str | None = None,
    preset: str = "tiny",
    candidates: Sequence[str] | None = None,
    warm_start: bool = False,
    steps: int | None = None,
    warmup_steps: int | None = None,
    steady_s: float = STEADY_S,
    verify: bool = False,
    on_event: Callable[[dict[str, Any]], None] | None = None,
) -> TuneResult:
    """Find the fastest recipe that is still correct for a run of ``steps_planned`` steps.

    Args:
        model: the ``--model`` factory: ``"module:function"`` (or ``"path/file.py:function"``),
            or a module-level function; it returns ``(model, make_batch[, lengths])`` (see
            ``torchcompile_kit.bench.load_model_spec``). Every candidate runs in a fresh process
            that calls it again, which is why a name and not a model object is passed; the batches
            are its ``make_batch(step)``. ``None``: the bench's captioner at ``preset``.
        steps_planned: the training steps of the planned run: the arithmetic's horizon.
        budget_s: wall seconds ``tune`` may spend (measurements and checks); ``None``: no limit.
            Candidates that do not fit are skipped with the reason.
        out_dir: where ``tune.json``, ``tune.png``, ``recommended.py`` and the runs' logs go;
            ``None``: a temporary directory (logs only).
        backend: ``torch.compile`` backend for every candidate (``None``: ``inductor``).
        preset: the captioner preset (``tiny``/``seed``) and default step counts.
        candidates: names to consider (default: all of ``candidate_names()``).
        warm_start: rank the warm restarts (a compile cache saved by an earlier run) for the
            planned run; otherwise they are shown as what a restart would cost.
        steps: steady steps each candidate is timed over (``None``: the preset's).
        warmup_steps: steps timed as warm-up from the cold start (``None``: the preset's).
        steady_s: time each candidate's steady steps for at least this many seconds (more than
            ``steps`` when they are fast, never more than ``steps_planned``): a shared machine's
            speed drifts within a minute, and a few steps' burst is not the run's mean. ``0``:
            just ``steps``.
        verify: afterwards run the recommendation for ``steps_planned`` steps in a fresh process
            and record predicted vs measured total (``TuneResult.verification``); outside the
            budget.
        on_event: progress callback, ``{"event": "candidate", "name": ..., "status": ...}``.

    Returns:
        The :class:`TuneResult` (ranked candidates, recommendation, reason, snippet).

    Raises:
        ValueError: a bad argument, an unknown candidate, or a ``model`` spec that does not load.

    Example:
        >>> result = tune("mypkg.models:build", steps_planned=5000, budget_s=1800)  # doctest: +SKIP
        >>> result.recommendation, result.reason  # doctest: +SKIP
        ('regional', 'regional: 1.4x eager per step, pays back its 41 s compile after ~300 ...')
    """
    check_positive_int("steps_planned", steps_planned)
    if not steady_s >= 0:
        raise ValueError(f"steady_s must be >= 0 seconds, got {steady_s!r}")
    if budget_s is not None and not budget_s > 0:
        raise ValueError(f"budget_s must be a positive number of seconds, got {budget_s!r}")
    names = candidate_names() if candidates is None else list(candidates)
    unknown = [n for n in names if n not in candidate_names()]
    if unknown:
        raise ValueError(f"unknown candidate(s) {unknown!r}; choose from {candidate_names()!r}")
    spec = _spec_string(model)
    loaded = load_model_spec(spec) if spec is not None else None  # fails early, with the reason
    started = time.perf_counter()
    out = Path(out_dir) if out_dir is not None else Path(tempfile.mkdtemp(prefix="tck-tune-"))
    out.mkdir(parents=True, exist_ok=True)
    backend = backend or "inductor"
    device = _device()
    emit = on_event or (lambda event: None)

    def left() -> float:
        return math.inf if budget_s is None else budget_s - (time.perf_counter() - started)

    chosen = [c for c in CANDIDATES if c.name in names]
    by_name = {c.name: c for c in CANDIDATES}
    gate = _Gate(by_name, spec, preset, backend, device, left, emit)
    results: list[CandidateResult] = []
    for candidate in chosen:
        measure_candidate(
            candidate,
            spec,
            preset,
            backend,
            steps,
            warmup_steps,
            steady_s,
            steps_planned,
            warm_start,
            out / "runs",
            left,
            emit,
            results,
        )
        # a candidate that now leads is checked at once, before the budget goes to the others
        gate.check_leaders(results, steps_planned, warm_start=warm_start)
    rank_candidates(results, steps_planned, warm_start=warm_start)  # costs: the check order
    gate.check_all(results)
    ranked, recommended = rank_candidates(results, steps_planned, warm_start=warm_start)
    result = TuneResult(
        recommendation=recommended.name if recommended else None,
        reason=recommendation_reason(recommended, ranked, steps_planned),
        snippet=_snippet(
            recommended,
            by_name,
            spec,
            backend,
            steps_planned,
            preset,
            transformers_model=_is_transformers(loaded),
        ),
        steps_planned=steps_planned,
        candidates=ranked,
        settings=_settings(
            spec, preset, backend, budget_s, steps, warmup_steps, steady_s, warm_start, device
        ),
        notes=_notes(loaded, preset, results),
    )
    if verify and recommended is not None:
        result.verification = verify_run(
            recommended, by_name, spec, preset, backend, steps_planned, out / "verify"
        )
    result.elapsed_s = time.perf_counter() - started
    if out_dir is not None:
        result.write_json(out / "tune.json")
        write_chart(result, out / "tune.png")
        (out / "recommended.py").write_text(result.snippet)
        (out / "tune.txt").write_text(format_table(result) + "\n\n" + result.reason + "\n")
    return result


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
            f"tune needs the model factory by name, because every candidate runs in a fresh "
            f"process that calls it again; {model!r} is not a module-level function of an "
            "importable module. Define it at the top level of a module and pass it (or "
            "'module:function')."
        )
    return f"{module}:{qualname}"


def _device() -> Any:
    import torch

    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def _model_and_batch(spec: str | None, preset: str, device: Any) -> Callable[[], tuple[Any, dict]]:
    """A fresh ``(model, first batch)`` on ``device``, for the correctness gate."""

    def build() -> tuple[Any, dict]:
        if spec is None:
            sizes = PRESETS[preset]
            model = build_captioner(sizes)
            captioner = ModelSpec(source=f"captioner:{preset}", model=model, make_batch=None)
            batch = next(batch_stream(RECIPES["eager"], captioner, sizes, device)[0])
        else:
            loaded = load_model_spec(spec)
            model, batch = loaded.model, loaded.make_batch(0)
        batch = {k: v.to(device) if hasattr(v, "to") else v for k, v in batch.items()}
        return model.to(device), batch

    return build


# --- checking and ranking ------------------------------------------------------------------------


class _Gate:
    """The correctness checks of one ``tune``: each compiled code checked once, within the budget."""

    def __init__(
        self,
        by_name: dict[str, Candidate],
        spec: str | None,
        preset: str,
        backend: str,
        device: Any,
        left: Callable[[], float],
        emit: Callable[[dict], None],
    ) -> None:
        self.by_name, self.backend, self.device = by_name, backend, device
        self.left, self.emit = left, emit
        self.build = _model_and_batch(spec, preset, device)
        self.verdicts: dict[tuple[str, str], Any] = {}

    def check_leaders(
        self, results: list[CandidateResult], steps_planned: int, *, warm_start: bool
    ) -> None:
        """Check the unchecked candidates predicted cheaper than the current recommendation.

        Cheapest first (the ranking's own costs and eligibility); stops at the first that
        passes: it is then the one to beat.
        """
        _, recommended = rank_candidates(results, steps_planned, warm_start=warm_start)
        best = recommended.predicted_total_s if recommended is not None else math.inf
        for result in self._measured(results):
            if result.verdict != "unchecked" or (result.restart and not warm_start):
                continue
            if result.predicted_total_s is None or result.predicted_total_s >= best:
                break
            if self.check(result) == "pass":
                break

    def check_all(self, results: list[CandidateResult]) -> None:
        """Check every measured compiled candidate, cheapest predicted total first, while time lasts."""
        for result in self._measured(results):
            if result.verdict == "unchecked":
                self.check(result)

    def check(self, result: CandidateResult) -> str:
        """Check one candidate (or reuse the verdict of its compiled code); its verdict."""
        candidate = self.by_name[result.name]
        key = (candidate.gate, candidate.optimizer)
        if key not in self.verdicts:
            need = _GATE_COST * (result.compile_s or 0.0)
            if self.left() < need:
                result.reason = (
                    f"not checked: {max(self.left(), 0):.0f} s of budget left, the correctness "
                    f"check needs ~{need:.0f} s; an unchecked candidate is never recommended"
                )
                return result.verdict
            self.emit({"event": "check", "name": result.name, "status": "running"})
            self.verdicts[key] = check_candidate(
                candidate,
                model_and_batch=self.build,
                backend=self.backend,
                overrides=OVERRIDES,
                device=self.device,
            )
            result.gate_s = self.verdicts[key].seconds
        verdict = self.verdicts[key]
        result.verdict = "pass" if verdict.ok else "fail"
        result.offending = verdict.offending
        if result.reason and result.reason.startswith("not checked:"):
            result.reason = None
        if result.graph_breaks is None:
            result.graph_breaks = verdict.graph_breaks
        self.emit({"event": "check", "name": result.name, "status": result.verdict})
        return result.verdict

    def _measured(self, results: list[CandidateResult]) -> list[CandidateResult]:
        measured = [r for r in results if r.status == "ok" and self.by_name[r.name].gate is not None]
        return sorted(measured, key=lambda r: r.predicted_total_s or math.inf)


# --- outputs -------------------------------------------------------------------------------------


def _is_transformers(loaded: ModelSpec | None) -> bool:
    """Whether the model holds a transformers model (the captioner does: ``loaded`` is None)."""
    if loaded is None:
        return True
    return any(type(m).__module__.startswith("transformers.") for m in loaded.model.modules())


def _snippet(
    chosen: CandidateResult | None,
    by_name: dict[str, Candidate],
    spec: str | None,
    backend: str,
    steps_planned: int,
    preset: str,
    *,
    transformers_model: bool,
) -> str:
    if chosen is None:
        return ""
    return make_snippet(
        by_name[chosen.name],
        spec=spec or "torchcompile_kit.tuning.examples:captioner_tiny",
        backend=backend,
        fullgraph=chosen.graph_breaks == 0,
        steps_planned=steps_planned,
        batch_size=PRESETS[preset].batch_size,
        transformers_model=transformers_model,
    )


def _settings(
    spec: str | None,
    preset: str,
    backend: str,
    budget_s: float | None,
    steps: int | None,
    warmup_steps: int | None,
    steady_s: float,
    warm_start: bool,
    device: Any,
) -> dict[str, Any]:
    versions = {
        name: str(package_version(name) or "-") for name in ("torch", "transformers", "peft")
    }
    return {
        "model": spec or f"captioner:{preset}",
        "preset": preset,
        "backend": backend,
        "budget_s": budget_s,
        "steps": steps,
        "warmup_steps": warmup_steps,
        "steady_s": steady_s,
        "warm_start": warm_start,
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
    timed = any(r.recipe == "buckets" and r.status == "ok" for r in results)
    measured = spec_buckets(loaded.lengths, PRESETS[preset]) if timed else None
    return bucket_notes(loaded.lengths, batch_size, measured)
