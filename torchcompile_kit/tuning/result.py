"""What ``tune`` found: every candidate's measurements and verdict, and the recommendation."""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal

from ..bench import Metrics, Speedup

__all__ = ["CandidateResult", "PredictionCheck", "Steadiness", "TuneResult"]

Status = Literal["ok", "failed", "skipped", "pruned"]
Verdict = Literal["pass", "fail", "unchecked", "eager"]


@dataclass(kw_only=True, frozen=True, slots=True)
class Steadiness:
    """Whether a long run kept one speed (``tuning.runs.run_steadiness``)."""

    steady: bool
    """The slowest span's median step is at most 1.5x the typical span's."""
    window_ms: list[float]
    """Each span's median step, milliseconds."""
    note: str
    """In words, and what to do when it did not."""


@dataclass(kw_only=True, slots=True)
class PredictionCheck:
    """What :func:`~torchcompile_kit.tuning.check_prediction` measured: the recommendation run
    for the planned steps, its total time against the predicted one.

    Example:
        >>> PredictionCheck(status="failed", error="the run ran out of memory").ratio is None
        True
    """

    status: str
    """``"ok"``, or the run's status (``"failed"``, ``"skipped"``)."""
    error: str | None = None
    """Why the run did not finish."""
    recipe: str | None = None
    """The recommendation that ran."""
    steps: int | None = None
    """The planned steps it ran."""
    predicted_s: float | None = None
    """What ``tune`` predicted the run takes."""
    measured_s: float | None = None
    """What it took: warm-up, cache load and every steady step."""
    ratio: float | None = None
    """Predicted ÷ measured."""
    predicted_step_ms: float | None = None
    """The steady step ``tune`` predicted."""
    cpu_steal: float | None = None
    """Share of the CPU time the hypervisor took during the run."""
    steadiness: Steadiness | None = None
    """Whether the run kept one speed (``None``: too short to tell)."""

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> PredictionCheck:
        """Rebuild from ``as_dict`` data (``tune.json``'s ``prediction_check``)."""
        known = set(cls.__dataclass_fields__) - {"steadiness"}
        steadiness = data.get("steadiness")
        return cls(
            **{k: v for k, v in data.items() if k in known},
            steadiness=Steadiness(**steadiness) if steadiness else None,
        )


@dataclass(kw_only=True, slots=True)
class CandidateResult:
    """One candidate: how it ran, what it costs for the planned run, whether it is correct."""

    name: str
    """The bench recipe it ran (``"regional"``)."""
    description: str
    """One line: what it does."""
    status: Status
    """``ok``; ``failed`` (raised or crashed); ``skipped`` (cannot run here, or no budget left);
    ``pruned`` (its compile alone exceeded the best predicted total: it cannot win)."""
    verdict: Verdict = "unchecked"
    """Correctness gate: ``pass``, ``fail``, ``unchecked`` (its run did not finish) or
    ``eager`` (nothing compiled, nothing to check)."""
    reason: str | None = None
    """Why it failed, was skipped or pruned."""
    offending: str | None = None
    """The gate's offending tensor (or error) when ``verdict == "fail"``."""
    restart: bool = False
    """A warm restart from a saved compile cache (the recipe's ``cache_from``)."""
    compile_s: float | None = None
    """One-off seconds before steady speed (cold, or warm for a restart)."""
    recompile_s: float | None = None
    """Seconds of recompiles seen in the steady steps."""
    step_s: float | None = None
    """Steady step of the planned run, seconds (see :mod:`.arithmetic`)."""
    measured_step_s: float | None = None
    """Mean timed steady step, when ``step_s`` was read off its tokens line at the planned
    run's mean padded tokens per step (``None``: ``step_s`` is that mean)."""
    speedup: Speedup | None = None
    """Eager's step time ÷ this step time in the planned run, with its 95% interval when the run
    stepped paired with eager's (:mod:`torchcompile_kit.bench.paired`): then ``step_s`` is eager's
    ÷ the paired ratio, not from two runs at different moments."""
    predicted_total_s: float | None = None
    """``compile_s + recompile_s + steps_planned * step_s``."""
    break_even_steps: float | None = None
    """Steps after which it beats eager in total (``inf``: never; 0: from the start)."""
    gate_s: float | None = None
    """Seconds the correctness check took (in the candidate's own process, after its run)."""
    gate_new_graphs: int | None = None
    """Graphs the check compiled on top of the run's: 0 when it reused the run's compiled model."""
    started_s: float | None = None
    """Seconds into ``tune`` when its run started (``None``: it never started)."""
    wall_s: float | None = None
    """Seconds its process took (start-up, build, compile, measurement, check)."""
    metrics: Metrics = field(default_factory=Metrics)
    """What the bench runner measured in the candidate's run (graphs, recompiles, graph breaks,
    losses, step times, padding ...)."""
    predicted_total_low_s: float | None = None
    """``predicted_total_s`` at the high end of the speedup's interval (the fast end)."""
    predicted_total_high_s: float | None = None
    """``predicted_total_s`` at the low end of the speedup's interval (the slow end)."""
    indistinguishable_from: list[str] = field(default_factory=list)
    """Candidates whose predicted-total intervals overlap this one's: the measurement cannot
    tell them apart for the planned run."""

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> CandidateResult:
        """Rebuild from :meth:`TuneResult.as_dict` data (``"inf"`` back to ``inf``)."""
        known = set(cls.__dataclass_fields__) - {"speedup", "metrics"}
        fields = {k: _finite(v) for k, v in data.items() if k in known}
        return cls(
            **fields,
            speedup=Speedup.from_row(data),
            metrics=Metrics.from_dict(data.get("metrics")),
        )

    @property
    def paired(self) -> bool:
        """Its speedup comes from steps paired with eager's in its own run."""
        return self.speedup is not None and self.speedup.paired

    @property
    def eligible(self) -> bool:
        """Measured and not shown wrong (``restart`` is decided by ``tune``'s ``warm_start``)."""
        return self.status == "ok" and self.verdict in ("pass", "eager")


@dataclass(kw_only=True, slots=True)
class TuneResult:
    """The outcome of :func:`torchcompile_kit.tuning`."""

    recommendation: str | None
    """The chosen candidate's name (``None`` when nothing could be measured)."""
    reason: str
    """Why, in one or two sentences, with the break-even numbers."""
    snippet: str
    """Ready-to-paste code that applies the recommendation with this library's helpers."""
    steps_planned: int
    """The run length the arithmetic is for."""
    candidates: list[CandidateResult]
    """Every candidate, ranked: eligible by predicted total first, then the rest."""
    settings: dict[str, Any] = field(default_factory=dict)
    """Model spec, backend, budget, versions, device, date."""
    notes: list[str] = field(default_factory=list)
    """What else the run found (bucket plan from the user's lengths, missing features ...)."""
    prediction_check: PredictionCheck | None = None
    """What :func:`~torchcompile_kit.tuning.check_prediction` measured, when kept here."""
    elapsed_s: float = 0.0
    """Seconds ``tune`` took."""

    def candidate(self, name: str) -> CandidateResult:
        """The result of candidate ``name`` (``KeyError`` if it was not considered)."""
        for result in self.candidates:
            if result.name == name:
                return result
        raise KeyError(f"no candidate {name!r}; have {[c.name for c in self.candidates]!r}")

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready data (``inf`` becomes the string ``"inf"``)."""
        return _jsonable(asdict(self))

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> TuneResult:
        """Rebuild from :meth:`as_dict` data (what ``tune.json`` holds)."""
        known = set(cls.__dataclass_fields__)
        fields = {k: v for k, v in data.items() if k in known}
        fields["candidates"] = [CandidateResult.from_dict(c) for c in data.get("candidates", [])]
        check = data.get("prediction_check")
        fields["prediction_check"] = PredictionCheck.from_dict(check) if check else None
        return cls(**fields)

    @classmethod
    def read_json(cls, path: str | Path) -> TuneResult:
        """Read what :meth:`write_json` wrote."""
        return cls.from_dict(json.loads(Path(path).read_text()))

    def write_json(self, path: str | Path) -> Path:
        """Write :meth:`as_dict` to ``path`` and return it."""
        path = Path(path)
        path.write_text(json.dumps(self.as_dict(), indent=2, default=str))
        return path


def _finite(value: Any) -> Any:
    return math.inf if value == "inf" else value


def _jsonable(value: Any) -> Any:
    if isinstance(value, float) and math.isinf(value):
        return "inf"
    if isinstance(value, dict):
        return {k: _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    return value
