"""``diagnose``: when ``torch.compile`` crashes or miscomputes, say where and why.

In order, stopping where it has the answer: the triage (the whole model at the user's settings,
judged against eager by the comparator, with its graph breaks and recompiles), the backend
ladder (the first backend where it goes wrong, and the inductor settings that hide it), the
module (the smallest part whose compile alone reproduces it, confirmed both ways), then a
verified workaround and a repro script. Every trial runs in a process of its own
(:mod:`.runner`), so a crash is a finding, not the end of the doctor.
"""

from __future__ import annotations

import json
import logging
import os
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from .. import _dynamo
from .._checks import check_compile_kwargs
from .fixes import Rewrite, propose_rewrite
from .locate import Located, locate
from .recompiles import explain_recompile
from .record import NUMERICS_SHARE, RECIPES, Diagnosis, Trial, TrialKind, TrialOutcome
from .repro import capture_calls, check_repro, write_repro
from .runner import TrialRunner

__all__ = ["diagnose"]

_FIXES_CHECKED = 5
"""Breaks whose fix the doctor checks (a trial each), as many as the summary shows."""

logger = logging.getLogger(__name__)


def diagnose(
    model: Any,
    batch: Any = None,
    *,
    recipe: str | None = None,
    autocast: str | None = None,
    out: str | os.PathLike[str] = "doctor-results",
    timeout_s: float = 600,
    **compile_kwargs: Any,
) -> Diagnosis:
    """Diagnose ``torch.compile(model)`` (or one of this library's recipes) on one batch: does it
    compile, run and compute what eager computes, and if not, at which backend, under which
    settings and in which module. Experimental: its bisection rests on torch's private compiler
    bisector and backend registry (``_dynamo/doctor.py``); the label can go when those are public.

    Args:
        model: a builder spec ``"mypkg.models:build"`` or ``"file.py:build"`` (the ``bench --model``
            contract: ``build() -> (model, make_batch)``), or an ``nn.Module`` whose class can be
            imported (it is pickled for the trials' processes) with ``batch``.
        batch: the batch (a dict of keyword arguments, a tuple or a tensor) for an ``nn.Module``;
            with a spec, ``make_batch(0)``.
        recipe: ``None`` diagnoses ``model.compile(**compile_kwargs)``; ``"regional"``,
            ``"model"`` or ``"peft"`` the library's ``compile_regional``, ``compile_model`` or
            ``compile_peft`` (then one more trial says whether a plain whole-model compile
            passes). The search for the module compiles parts plainly either way.
        autocast: run under ``torch.autocast`` with this dtype (``"bfloat16"``, ``"float16"``),
            as the user trains; ``None``: no autocast.
        out: the folder for ``doctor.json``, the repro script and each trial's log.
        timeout_s: seconds one trial may run before it counts as hung.
        **compile_kwargs: the ``torch.compile`` keywords the user compiles with: ``backend`` (a
            name, or ``"module:attribute"`` of a backend callable; default ``"inductor"``),
            ``dynamic``, ``mode``, ``fullgraph``, ``options``.

    Returns:
        The :class:`~torchcompile_kit.doctor.Diagnosis` (also ``out/doctor.json``, rewritten after
        every trial).

    Raises:
        TypeError: ``model`` is neither a spec string nor an ``nn.Module``, a module is given
            without ``batch``, or a keyword is not ``torch.compile``'s.
        ValueError: the spec cannot be loaded, the module's class cannot be imported by another
            process, or ``timeout_s`` is not positive.

    Example:
        >>> diagnosis = diagnose("mypkg.models:build", out="doctor-out")  # doctest: +SKIP
        >>> diagnosis = diagnose(model, batch, recipe="regional",
        ...                      dynamic=False)  # doctest: +SKIP
        >>> print(diagnosis.summary())  # doctest: +SKIP
        doctor: MISCOMPUTE (gradients differ); torch 2.13.0+cpu, cpu, 11 trials, 95 s
    """
    if recipe is not None and recipe not in RECIPES:
        raise ValueError(
            f"diagnose(recipe={recipe!r}): pass None (torch.compile) or one of {list(RECIPES)}"
        )
    check_compile_kwargs(compile_kwargs, caller="diagnose")
    kwargs = dict(compile_kwargs)
    backend = kwargs.pop("backend", "inductor")
    if autocast not in (None, "bfloat16", "float16"):
        raise ValueError(f"diagnose(autocast={autocast!r}): pass 'bfloat16', 'float16' or None")
    if not isinstance(timeout_s, (int, float)) or isinstance(timeout_s, bool) or timeout_s <= 0:
        raise ValueError(
            f"diagnose(timeout_s={timeout_s!r}): pass the seconds one trial may run (> 0), e.g. 600"
        )
    start = time.perf_counter()
    folder = Path(out)
    folder.mkdir(parents=True, exist_ok=True)
    module, batch, inputs, device = _save_inputs(model, batch, folder)
    runner = TrialRunner(folder, inputs, timeout_s=timeout_s)
    import torch

    diagnosis = Diagnosis(torch=torch.__version__, device=device)
    doctor = _Doctor(runner, diagnosis, folder, start)
    user = Trial(
        kind=TrialKind.TRIAGE,
        backend=backend,
        compile_kwargs=kwargs,
        autocast=autocast,
        recipe=recipe,
        monitor=True,
    )
    try:
        doctor.run(user, module, batch)
    finally:
        runner.close()
        diagnosis.seconds = round(time.perf_counter() - start, 1)
        diagnosis.complete = True
        doctor.save()
    return diagnosis


@dataclass(slots=True)
class _Finding:
    """What one step of the diagnosis found: fields of :class:`Diagnosis` with their values,
    and notes; the step returns it, :meth:`_Doctor.record` writes it."""

    fields: dict[str, Any] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)


class _Doctor:
    """The steps of one diagnosis, each trial saved as it ends."""

    def __init__(
        self, runner: TrialRunner, diagnosis: Diagnosis, folder: Path, start: float
    ) -> None:
        self.runner, self.diagnosis, self.folder, self.start = runner, diagnosis, folder, start

    def trial(self, trial: Trial) -> TrialOutcome:
        _progress(f"[doctor {self.runner.count + 1}] {trial.label} ...")
        outcome = self.runner.run(trial)
        self.diagnosis.trials.append(outcome)
        self.save()
        _progress(
            f"[doctor {self.runner.count}] {trial.label}: {outcome.status}"
            + (f" ({', '.join(outcome.differs)})" if outcome.differs else "")
            + f" in {outcome.seconds:.1f} s; {time.perf_counter() - self.start:.0f} s so far"
        )
        return outcome

    def record(self, found: _Finding) -> None:
        """Write what a step found into the diagnosis, and save it."""
        for name, value in found.fields.items():
            setattr(self.diagnosis, name, value)
        self.diagnosis.notes += found.notes
        self.save()

    def save(self) -> None:
        path = self.folder / "doctor.json"
        path.write_text(json.dumps(self.diagnosis.as_dict(), indent=1, default=str))

    def run(self, user: Trial, model: Any, batch: Any) -> None:
        diagnosis = self.diagnosis
        diagnosis.notes.append(
            f"every verdict holds for what ran: this batch, torch "
            f"{diagnosis.torch}, {diagnosis.device}, "
            f"backend={user.backend}, {user.compile_kwargs or 'default settings'}"
            + (f", recipe={user.recipe}" if user.recipe else "")
        )
        triage = self.trial(user)
        diagnosis.graph_breaks = self.break_fixes(user, triage.graph_breaks)
        diagnosis.recompiles = [explain_recompile(guard) for guard in triage.recompiles]
        diagnosis.pays = triage.pays
        if triage.limit_hits:
            diagnosis.notes.append(
                f"{triage.limit_hits} recompile-limit hit(s) on the second batch "
                "shape: those frames run eagerly from then on"
            )
        if triage.status == "eager-error":
            diagnosis.result = "eager-error"
            diagnosis.notes.append(
                f"the model fails without compiling ({triage.error}): not a compiler problem"
            )
            return
        if not triage.bad:
            share = triage.worst_share or 0.0
            diagnosis.result = "numerics" if share > NUMERICS_SHARE else "ok"
            if triage.worst:
                diagnosis.notes.append(
                    f"compiled equals eager by the comparator, judged against "
                    f"{triage.reference}; closest to its limit: {triage.worst}"
                    + (
                        f". More than {NUMERICS_SHARE:g} of its allowance (healthy compiles "
                        "measured here use at most 0.41 of it): within the rule, but near its "
                        "line; another torch or setting may tip it over"
                        if diagnosis.result == "numerics"
                        else ""
                    )
                )
            if not triage.graphs and triage.graphs is not None:
                diagnosis.notes.append("compiled nothing: dynamo compiled no graph")
            return
        _progress(_budget(model, user, triage.seconds))
        again = self.trial(user.variant(TrialKind.AGAIN))
        if again.status != triage.status:
            diagnosis.result = "nondeterministic"
            diagnosis.notes.append(
                f"the same trial gave {triage.status} then {again.status}: no "
                "cause is claimed for a result that changes between runs"
            )
            return
        diagnosis.result = triage.status
        diagnosis.differs = triage.differs
        first_bad = self.ladder(user)
        diagnosis.first_bad_backend = first_bad
        failing = user.variant(TrialKind.FAILING, backend=first_bad)
        if first_bad != user.backend:
            failing.compile_kwargs = {
                k: v for k, v in user.compile_kwargs.items() if k not in ("mode", "options")
            }
        if first_bad == "eager":
            diagnosis.notes.append(
                "it fails with backend='eager' (dynamo alone, no AOTAutograd or "
                "inductor): the model's code, its inputs or dynamo, not inductor"
            )
        if user.recipe:
            self.record(self.without_recipe(failing))
        located = locate(model, self.trial, failing)
        culprit_paths = [p for unit in located.culprits for p in unit.paths]
        if first_bad == "inductor":  # on the culprit alone: a smaller compile per setting
            self.record(self.settings(failing, culprit_paths or None))
        self.record(self.conclude(located, culprit_paths))
        self.record(self.repro(model, batch, failing, culprit_paths))
        bisectable = first_bad in ("aot_eager_decomp_partition", "inductor")
        if bisectable and triage.status != "crashed":  # in-process: no crash
            where = ", ".join(unit.label for unit in located.culprits) or "the whole model"
            bisect = failing.variant(
                TrialKind.BISECT, where, modules=culprit_paths or None, bisect=True
            )
            found = self.trial(bisect)
            diagnosis.bisect = found.bisect or ({"error": found.error} if found.error else None)
        else:
            diagnosis.notes.append(
                "torch's pass-level bisection: not run ("
                + (
                    "the process crashes, and the bisector runs in it"
                    if triage.status == "crashed"
                    else "it bisects decompositions and inductor; the first bad backend is "
                    f"{first_bad}"
                )
                + ")"
            )

    def break_fixes(self, user: Trial, breaks: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """The breaks with their fixes: for a line of the user's code that a known rewrite
        fits (:mod:`.fixes`; any of the line's reasons, torch's "graph break in loop" among
        them), a trial of its own applies it to the model's class and checks it (backend
        ``eager``: breaks are dynamo's); any other break keeps torch's hint, unverified."""
        checked: dict[str, dict[str, Any]] = {}
        for found in breaks:
            where = found["location"]
            if where in checked or len(checked) >= _FIXES_CHECKED or found.get("in_torch"):
                continue
            reasons = " ".join(b["reason"] for b in breaks if b["location"] == where)
            rewrite = (
                propose_rewrite(found["file"], found["line"], reasons)
                if found.get("file") and found.get("line")
                else None
            )
            if rewrite is not None:
                checked[where] = self.check_fix(user, where, rewrite)
        return [{**b, "fix_verified": None, **checked.get(b["location"], {})} for b in breaks]

    def check_fix(self, user: Trial, where: str, rewrite: Rewrite) -> dict[str, Any]:
        """Apply ``rewrite`` in a trial: verified when the break at ``where`` is gone and eager
        computes what it computed before."""
        check = self.trial(
            user.variant(
                TrialKind.FIX,
                where,
                backend="eager",
                compile_kwargs={},
                inductor={},
                recipe=None,
                monitor=True,
                rewrite=asdict(rewrite),
            )
        )
        still = [b for b in check.graph_breaks if b["location"] == where]
        why = (
            check.error
            or (f"the fixed model gave {check.status}" if check.status != "ok" else None)
            or (None if check.rewrite_equal else "eager's loss or gradients changed")
            or (f"the line still breaks: {still[0]['reason']}" if still else None)
        )
        shown = rewrite.shown.replace(":\n    ", ": ").replace("\n", "; ")
        fix = {"fix": f"write line {rewrite.line} as `{shown}`", "fix_verified": not why}
        return {**fix, "fix_check": why} if why else fix

    def ladder(self, user: Trial) -> str:
        """The first backend of the ladder that fails; the user's when every debug rung passes."""
        for rung in _dynamo.ladder_backends():
            if rung == user.backend:
                break
            # inductor's own keywords (mode, options) mean nothing to a debug backend
            kwargs = {k: v for k, v in user.compile_kwargs.items() if k not in ("mode", "options")}
            if self.trial(
                user.variant(TrialKind.LADDER, rung, backend=rung, compile_kwargs=kwargs)
            ).bad:
                return rung
        return user.backend

    def settings(self, user: Trial, paths: list[str] | None) -> _Finding:
        """Which inductor settings make the problem go away (``hidden_by``): each a trial at
        the user's backend, compiling ``paths`` (the culprits; ``None``: the whole model)."""
        found = _Finding(fields={"hidden_by": []})
        if paths:
            found.notes.append(
                f"the settings were tried on {_first_few(paths)} alone (the rest eager)"
            )
        on_cpu = self.diagnosis.device.startswith("cpu")
        tried = {}
        for name, settings in _dynamo.DEBUG_SETTINGS.items():
            if "cpp." in next(iter(settings)) and not on_cpu:
                continue
            if _dynamo.missing_settings(settings):
                found.notes.append(f"{name}: not tried (this torch has no such setting)")
                continue
            tried[name] = user.variant(TrialKind.SETTING, name, inductor=settings, modules=paths)
        flipped = {None: True, False: True, True: False}[user.compile_kwargs.get("dynamic")]
        kwargs = {**user.compile_kwargs, "dynamic": flipped}
        tried[f"dynamic={flipped}"] = user.variant(
            TrialKind.SETTING, f"dynamic={flipped}", compile_kwargs=kwargs, modules=paths
        )
        found.fields["hidden_by"] = [n for n, trial in tried.items() if not self.trial(trial).bad]
        return found

    def without_recipe(self, failing: Trial) -> _Finding:
        """With a recipe: does the model compiled whole by plain ``model.compile`` pass?"""
        plain = self.trial(failing.variant(TrialKind.WITHOUT_RECIPE, "model.compile", recipe=None))
        if plain.bad:
            note = (
                f"model.compile (the whole model, no recipe) fails as well ({plain.status}): "
                f"not the {failing.recipe} recipe's doing"
            )
            return _Finding(notes=[note])
        note = (
            f"model.compile (the whole model, no recipe) passes where the {failing.recipe} "
            "recipe fails: the recipe's graphs (or its handling) expose it"
        )
        workaround = (
            f"compile the whole model (model.compile) instead of the {failing.recipe} recipe: "
            "passed on this batch"
        )
        return _Finding(fields={"workaround": workaround}, notes=[note])

    @staticmethod
    def conclude(located: Located, paths: list[str]) -> _Finding:
        """The culprits, whether confirmed, and the workaround (``paths``: the
        culprits' modules)."""
        found = _Finding(
            fields={
                "culprits": [unit.label for unit in located.culprits] or None,
                "culprit_confirmed": located.confirmed,
                "whole_graph_only": located.whole_graph_only,
                "culprit_indivisible": located.indivisible,
            }
        )
        if not located.culprits:
            found.notes.append(
                "only the whole model compiled at once reproduces it: no part "
                "alone does (its own forward, or a fusion across modules)"
            )
            return found
        names = ", ".join(unit.describe() for unit in located.culprits)
        if located.confirmed:
            found.fields["workaround"] = (
                f"leave {names} eager: torch.compiler.disable on "
                f"{'its' if len(paths) == 1 else 'their'} forward "
                f"({_first_few(paths)}); "
                "the rest compiled passed on this batch"
            )
        else:
            found.notes.append(
                f"{names}: alone it reproduces, but the model compiled without "
                "it still fails: not confirmed as the only cause"
            )
        return found

    def repro(self, model: Any, batch: Any, failing: Trial, paths: list[str]) -> _Finding:
        """Write the repro scripts for the culprits (no culprit: the whole model), run the
        standalone one and say whether it reproduces."""
        diagnosis, found = self.diagnosis, _Finding()
        where = _first_few(paths) or "the whole model"
        title = (
            f"{diagnosis.result}"
            + (f" ({', '.join(diagnosis.differs)})" if diagnosis.differs else "")
            + f" with backend={failing.backend!r} when {where[:200]} is compiled"
            f" (torch {diagnosis.torch}, {diagnosis.device})"
        )
        request = self.runner.request(
            failing.variant(TrialKind.REPRO, modules=paths or None), "repro"
        )
        try:
            calls = capture_calls(model, batch, paths or [""], failing.autocast)
        except Exception as err:  # noqa: BLE001 - the replay still stands
            found.notes.append(f"no standalone repro: capturing the inputs raised {err!r:.200}")
            calls = []
        standalone, replay = write_repro(self.folder, calls, failing, title, request)
        found.fields["replay"] = str(replay)
        if not calls:
            return found
        _progress("[doctor] running the standalone repro script ...")
        trace = self.folder / "trace"
        check = check_repro(standalone, timeout_s=self.runner.timeout_s, trace=trace)
        found.fields.update(
            repro=str(standalone),
            repro_fails=check.fails,
            trace=str(trace) if trace.is_dir() else None,
        )
        if not check.fails:
            found.notes.append(
                "the standalone repro (the culprit alone on the inputs it received) does not "
                f"reproduce: it needs the model around it; {replay.name} replays the failing trial"
            )
        return found


def _budget(model: Any, user: Trial, seconds: float) -> str:
    """What the rest may cost, said up front: trials by step, at the triage's seconds each."""
    from .locate import Unit, children

    ladder = len(_dynamo.ladder_backends())
    settings = len(_dynamo.DEBUG_SETTINGS) + 1 if user.backend == "inductor" else 0
    level, parts = [Unit(label="", paths=("",), class_name="")], 0
    for _ in range(5):  # the widest level a descent may try: the top, then four deep
        widths = [children(model, unit) for unit in level]
        parts += max(map(len, widths), default=0)
        level = [child for kids in widths for child in kids]
    total = 1 + ladder + settings + parts + 2
    return (
        f"[doctor] budget: up to about {total} more trials (again, ladder {ladder}, settings "
        f"{settings}, localisation ~{total - 3 - ladder - settings}, confirm, bisect), "
        f"at most ~{total * seconds / 60:.0f} min if each took the triage's {seconds:.0f} s "
        "(a part compiles less than the whole model)"
    )


def _first_few(paths: list[str]) -> str:
    """``a, b, c, d, ...``: the first four module paths, for a line of text."""
    return ", ".join(paths[:4]) + (", ..." if len(paths) > 4 else "")


def _progress(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def _save_inputs(model: Any, batch: Any, folder: Path) -> tuple[Any, Any, dict[str, Any], str]:
    """Build (or take) the model and the batch once, and save what every trial loads: the same
    weights and the same tensors, strides included."""
    import torch

    from ..bench import load_model_spec

    torch.manual_seed(0)
    if isinstance(model, str):
        spec = load_model_spec(model)
        module, batch = spec.model, spec.make_batch(0)
        torch.save(module.state_dict(), folder / "state.pt")
        inputs = {"spec": model, "state": str(folder / "state.pt")}
    elif isinstance(model, torch.nn.Module):
        if batch is None:
            raise TypeError(
                "diagnose(model, batch): with a module, pass the batch it runs on "
                "(a dict of keyword arguments, a tuple or a tensor)"
            )
        module = model
        if type(model).__module__ == "__main__":
            raise ValueError(
                f"diagnose: {type(model).__name__} is defined in __main__, so the "
                "trials' processes cannot import it; move the class to a module, or "
                "pass a builder spec 'mypkg.models:build'"
            )
        torch.save(model, folder / "model.pt")
        inputs = {"model": str(folder / "model.pt")}
    else:
        raise TypeError(
            f"diagnose(model={model!r:.80}): pass a builder spec 'mypkg.models:build' "
            "(or 'file.py:build') or an nn.Module with its batch"
        )
    torch.save(batch, folder / "batch.pt")
    device = next((str(p.device) for p in module.parameters()), "cpu")
    if device == "cpu":  # the vector code it ran (what the trials' processes will pick)
        isa = os.environ.get("ATEN_CPU_CAPABILITY") or torch.backends.cpu.get_cpu_capability()
        device += f" ({isa.upper()})"
    return module, batch, {**inputs, "batch": str(folder / "batch.pt"), "seed": 0}, device
