"""The doctor's records: a trial (what is compiled how, in a process of its own), what it gave,
and the diagnosis written to ``doctor.json`` (data only)."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from enum import StrEnum
from typing import Any, Literal

from .recompiles import RecompileFinding

__all__ = [
    "EXIT_CODES",
    "NUMERICS_SHARE",
    "RECIPES",
    "RESULTS",
    "Diagnosis",
    "Trial",
    "TrialKind",
    "TrialOutcome",
]

Status = Literal[
    "ok", "eager-error", "compile-error", "runtime-error", "crashed", "timeout", "miscompute"
]
RECIPES = ("regional", "model", "peft")
"""The library's recipes the doctor can diagnose (:attr:`Trial.recipe`)."""
RESULTS = (
    "ok",
    "compile-error",
    "runtime-error",
    "crashed",
    "miscompute",
    "numerics",
    "nondeterministic",
    "eager-error",
    "timeout",
)
"""What a diagnosis can conclude (:attr:`Diagnosis.result`)."""
_FAILED = ("compile-error", "runtime-error", "crashed", "miscompute", "timeout")
"""The results the doctor goes on to localise (a nondeterministic one it does not)."""
EXIT_CODES = {
    "ok": 0,
    "miscompute": 10,
    "crashed": 11,
    "compile-error": 12,
    "runtime-error": 13,
    "nondeterministic": 14,
    "numerics": 15,
    "eager-error": 16,
    "timeout": 17,
}
"""``torchcompile-kit doctor``'s exit status for each result (2: a usage error; 1: the doctor
itself failed), so that a CI job can gate on it (docs/troubleshooting.md)."""
NUMERICS_SHARE = 0.5
"""A passing compile whose worst tensor used more of its allowance than this is ``numerics``:
within the rule, but near its line (healthy inductor compiles measured here use at most 0.41 of
it, docs/diagnostics.md). Below it, a pass is ``ok``, bf16 rounding included."""


class TrialKind(StrEnum):
    """What a trial asks, in the doctor's order (the value starts its label)."""

    TRIAGE = "triage"
    """The user's settings on the whole model."""
    AGAIN = "triage, again (is it deterministic?)"
    """The failing triage run once more."""
    FIX = "fix"
    """A graph break's fix applied (:attr:`Trial.rewrite`); subject: the break's file:line."""
    LADDER = "ladder"
    """A debugging backend of the ladder; subject: the backend."""
    FAILING = "failing"
    """The first failing rung's settings: the base of what follows, not run itself."""
    WITHOUT_RECIPE = "without the recipe"
    """The whole model by plain ``model.compile``."""
    ALONE = "alone"
    """A part compiled alone, the rest eager; subject: the part."""
    EVERYTHING_BUT = "everything but"
    """The model compiled with the culprits eager; subject: the culprits."""
    SETTING = "setting"
    """An inductor setting (or the other ``dynamic=``); subject: the setting."""
    REPRO = "repro"
    """The failing trial as a repro script replays it."""
    BISECT = "bisect"
    """torch's pass-level bisection; subject: where."""


@dataclass(kw_only=True, slots=True)
class Trial:
    """One run of eager against compiled on the batch, in a process of its own."""

    kind: TrialKind = TrialKind.TRIAGE
    """What it asks."""
    subject: str = ""
    """Of what (``"aot_eager"`` for a ladder rung, ``"transformer.h.*.mlp"`` for a part)."""
    label: str = ""
    """Its name in the log and record: ``"ladder: aot_eager"`` (from the kind and subject when
    not given)."""
    backend: str = "inductor"
    """A ``torch.compile`` backend name, or ``"module:attribute"`` of a backend callable."""
    compile_kwargs: dict[str, Any] = field(default_factory=dict)
    """Further ``torch.compile`` keywords (``dynamic``, ``mode``, ``fullgraph``)."""
    inductor: dict[str, Any] = field(default_factory=dict)
    """Inductor settings for this trial (``{"fallback_random": True}``)."""
    modules: list[str] | None = None
    """Compile only these modules (paths in the model), the rest eager; ``None``: the whole model.
    """
    exclude: list[str] = field(default_factory=list)
    """With the whole model compiled, leave these modules eager."""
    monitor: bool = False
    """Record graph breaks and recompiles (with the builder's second batch when it differs)."""
    bisect: bool = False
    """Instead of one comparison, run torch's pass-level bisection over repeated ones."""
    autocast: str | None = None
    """Run both sides under ``torch.autocast`` with this dtype (``"bfloat16"``, ``"float16"``)."""
    rewrite: dict[str, Any] | None = None
    """A fix for a graph break to apply to the model's class first (``file``, ``line``,
    ``kind``: :class:`~torchcompile_kit.doctor.fixes.Rewrite`)."""
    recipe: str | None = None
    """Compile the whole model with this library's recipe (``"regional"``: ``compile_regional``,
    ``"model"``: ``compile_model``, ``"peft"``: ``compile_peft``) instead of ``model.compile``;
    trials of parts (``modules``, ``exclude``) compile plainly."""

    def __post_init__(self) -> None:
        self.kind = TrialKind(self.kind)
        if not self.label:
            self.label = f"{self.kind}: {self.subject}" if self.subject else str(self.kind)

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready."""
        return asdict(self)

    def names(self) -> dict[str, Any]:
        """``label``, ``kind`` and ``subject``: what its outcome carries of it."""
        return {"label": self.label, "kind": self.kind, "subject": self.subject}

    def variant(self, kind: TrialKind, subject: str = "", **changes: Any) -> Trial:
        """This trial as another kind of trial (of ``subject``), with ``changes``, without the
        monitor (only the triage records breaks and recompiles)."""
        fields = {**self.as_dict(), "label": "", "monitor": False, **changes}
        return Trial(**{**fields, "kind": kind, "subject": subject})


@dataclass(kw_only=True, slots=True)
class TrialOutcome:
    """What a trial gave."""

    label: str
    """The trial's label."""
    kind: TrialKind = TrialKind.TRIAGE
    """The trial's kind."""
    subject: str = ""
    """The trial's subject (a ladder rung, a setting, a part)."""
    status: Status
    """``ok``; ``miscompute`` (a tensor differs beyond the comparator's rule); ``compile-error`` /
    ``runtime-error`` (raised while compiling / running compiled code); ``crashed`` (the process
    died: :attr:`signal`); ``timeout``; ``eager-error`` (the model fails without compiling)."""
    differs: list[str] = field(default_factory=list)
    """Which parts differ: ``forward``, ``loss``, ``gradients``, ``step``."""
    worst: str | None = None
    """The worst tensor, in the comparator's words (a passing one too: how close it came)."""
    worst_share: float | None = None
    """How much of its allowance the worst tensor used (at most 1 passes)."""
    reference: str = ""
    """What the tensors were judged against, in words (the right reference: float32 under
    autocast or 16-bit weights, float64 otherwise, or none needed)."""
    error: str | None = None
    """``Type: first line`` of what was raised."""
    signal: int | None = None
    """The signal that killed the process (``crashed``)."""
    stage: str | None = None
    """How far the process got before it died: ``"eager"``, ``"compiling"`` or ``"compiled"``."""
    graphs: int | None = None
    """Graphs dynamo compiled (with ``monitor``)."""
    graph_breaks: list[dict[str, Any]] = field(default_factory=list)
    """Each distinct break: ``location``, ``reason``, ``in_torch``, ``fix`` (torch's first hint)
    (with ``monitor``)."""
    recompiles: list[str] = field(default_factory=list)
    """Each recompile's failed guard (with ``monitor``)."""
    limit_hits: int = 0
    """Recompile-limit hits (with ``monitor``)."""
    rewrite_equal: bool | None = None
    """With ``rewrite``: eager's loss and gradients on the batch are what they were before it."""
    bisect: dict[str, Any] | None = None
    """With ``bisect``: torch's answer (``backend``, ``subsystem``, ``bisect_number``,
    ``debug_info``), or ``{"error": ...}``; ``None`` when every backend passed."""
    pays: dict[str, Any] | None = None
    """With ``monitor``, when the compiled run was right: ``eager_step_s``, ``compiled_step_s``
    (medians of forward and backward, stepped in alternation), ``speedup`` with ``low``/``high``
    (95% interval), ``compile_s`` and ``payback_steps`` (``None``: it does not pay back)."""
    seconds: float = 0.0
    """Wall seconds of the trial's process."""

    @property
    def bad(self) -> bool:
        """The compiled run failed in a way the eager one did not."""
        return self.status in ("miscompute", "compile-error", "runtime-error", "crashed", "timeout")

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready."""
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> TrialOutcome:
        """Read back what :meth:`as_dict` wrote."""
        return cls(**{**data, "kind": TrialKind(data.get("kind", TrialKind.TRIAGE))})


@dataclass(kw_only=True, slots=True)
class Diagnosis:
    """The doctor's answer (``DIR/doctor.json``)."""

    result: str = "ok"
    """One of :data:`RESULTS`."""
    differs: list[str] = field(default_factory=list)
    """Which of forward / loss / gradients / step differ (a miscompute)."""
    first_bad_backend: str | None = None
    """The first rung of the ladder (eager, aot_eager, aot_eager_decomp_partition, the backend)
    where it goes wrong; ``None`` when nothing did."""
    hidden_by: list[str] = field(default_factory=list)
    """Settings under which the problem went away on that rung (each a trial that passed)."""
    culprits: list[str] | None = None
    """The smallest modules whose compile alone reproduces it (paths, ``*`` for every repeated
    block), or ``None``."""
    culprit_confirmed: bool = False
    """Confirmed both ways: the culprits compiled alone fail, and the model compiled with them
    eager passes."""
    whole_graph_only: bool = False
    """Only the whole model compiled at once reproduces it, no part alone (its own forward, or a
    fusion across modules): :attr:`culprits` is ``None``."""
    culprit_indivisible: bool = False
    """The culprit alone reproduces it, none of its parts alone (a fusion across them, or its own
    forward)."""
    bisect: dict[str, Any] | None = None
    """torch's pass-level bisection inside the culprit, where run; ``None`` otherwise."""
    workaround: str | None = None
    """A workaround verified on this batch (the confirming trial), or ``None``."""
    repro: str | None = None
    """Path of the standalone repro script (torch and the model's code only): the culprit
    compiled alone on the inputs it received, against eager and float64."""
    repro_fails: bool | None = None
    """The doctor ran :attr:`repro`: ``True`` it reproduces (exits 1), ``False`` it does not (the
    culprit needs the model around it: use :attr:`replay`); ``None``: not written."""
    replay: str | None = None
    """Path of the script that replays the doctor's failing trial through this library."""
    trace: str | None = None
    """``TORCH_TRACE`` folder of the repro's run, for ``tlparse``."""
    graph_breaks: list[dict[str, Any]] = field(default_factory=list)
    """The triage's graph breaks: ``location``, ``reason``, ``in_torch``, and ``fix`` with
    ``fix_verified`` (``True``: a trial applied the fix to the model's class and the break was
    gone with eager's loss and gradients unchanged; ``False``: that trial says why not in
    ``fix_check``; ``None``: torch's hint, unchecked)."""
    recompiles: list[RecompileFinding] = field(default_factory=list)
    """The triage's recompiles: each failed guard, what changed and whether it recurs in
    training (a shape or value that changes per batch) or happens once (the doctor's own
    eval/train switch)."""
    pays: dict[str, Any] | None = None
    """Whether the compile pays on this batch (:attr:`TrialOutcome.pays` of the triage)."""
    torch: str = ""
    """The torch version it ran."""
    device: str = ""
    """Where it ran (``cpu``, ``cuda:0``)."""
    seconds: float = 0.0
    """Wall seconds of the whole diagnosis."""
    trials: list[TrialOutcome] = field(default_factory=list)
    """Every trial, in order."""
    notes: list[str] = field(default_factory=list)
    """What it saw, could not do, or refuses to claim."""
    complete: bool = False
    """``False`` while it runs (an interrupted run leaves a readable record)."""

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready (``doctor.json``)."""
        return asdict(self)

    def contradictions(self) -> list[str]:
        """What this record says that another of its fields denies (empty: nothing), so that a
        tool reading ``doctor.json`` can trust each field alone.

        Example:
            >>> Diagnosis(result="ok", culprits=["head.1"]).contradictions()
            ['result ok, yet culprits are named']
        """
        found = []
        if self.result not in RESULTS:
            found.append(f"result {self.result!r} is none of {list(RESULTS)}")
        if self.result not in _FAILED:
            named = {
                "culprits are named": self.culprits,
                "a first bad backend is named": self.first_bad_backend,
                "parts differ": self.differs,
                "settings hide it": self.hidden_by,
                "a workaround is given": self.workaround,
                "a repro is written": self.repro,
                "only the whole graph reproduces": self.whole_graph_only,
            }
            found += [f"result {self.result}, yet {what}" for what, value in named.items() if value]
        if bool(self.differs) != (self.result == "miscompute"):
            found.append(f"result {self.result} with differs {self.differs}")
        if self.whole_graph_only and self.culprits:
            found.append("whole_graph_only, yet culprits are named")
        if (self.culprit_confirmed or self.culprit_indivisible) and not self.culprits:
            found.append("a culprit is confirmed or indivisible, yet none is named")
        if self.repro_fails is not None and not self.repro:
            found.append("repro_fails is set, yet no repro was written")
        return found

    def summary(self) -> str:
        """One screen: the result, the ladder, where, the workaround, the repro."""
        lines = [
            f"doctor: {self.result.upper()}"
            + (f" ({', '.join(self.differs)} differ)" if self.differs else "")
            + f"; torch {self.torch}, {self.device}, {len(self.trials)} trials, "
            f"{self.seconds:.0f} s"
        ]
        triage = self.trials[0] if self.trials else None
        if triage is not None and (triage.worst or triage.error):
            lines.append(
                f"  triage   {triage.worst or triage.error}"
                + (f" (signal {triage.signal}, while {triage.stage})" if triage.signal else "")
            )
        ladder = [t for t in self.trials if t.kind == TrialKind.LADDER]
        if ladder:
            lines.append(
                "  ladder   "
                + " · ".join(f"{t.subject} {'BAD' if t.bad else 'ok'}" for t in ladder)
            )
        if self.first_bad_backend:
            lines.append(f"  first bad backend  {self.first_bad_backend}")
        settings = [t for t in self.trials if t.kind == TrialKind.SETTING]
        if settings:
            lines.append(
                "  hidden by  "
                + (
                    ", ".join(self.hidden_by)
                    if self.hidden_by
                    else "none of " + ", ".join(t.subject for t in settings)
                )
            )
        if self.bisect:
            found = self.bisect
            lines.append(
                "  bisect   "
                + (
                    f"could not finish: {found['error']}"
                    if "error" in found
                    else f"{found['backend']} / {found['subsystem'] or '(no single subsystem)'}"
                    + (f" #{found['bisect_number']}" if found.get("bisect_number") else "")
                    + (f": {found['debug_info']}" if found.get("debug_info") else "")
                    + " (turning it off hides it; that does not make it the bug)"
                )
            )
        if self.culprits:
            where = ", ".join(self.culprits)
            how = (
                "confirmed both ways (alone it fails; everything else compiled passes)"
                if self.culprit_confirmed
                else "NOT confirmed both ways"
            )
            lines.append(
                f"  where    {where}"
                + (
                    " (only as a whole: none of its parts alone)"
                    if self.culprit_indivisible
                    else ""
                )
                + f": {how}"
            )
        if self.pays:
            lines.append(f"  pays     {_pays_line(self.pays)}")
        lines += _breaks_lines(self.graph_breaks) + _recompiles_lines(self.recompiles)
        if self.workaround:
            lines.append(f"  workaround (verified on this batch only): {self.workaround}")
        if self.repro:
            lines.append(
                f"  repro    {self.repro} ("
                + (
                    "standalone; fails on this torch"
                    if self.repro_fails
                    else f"does not fail alone: the culprit needs its model; {self.replay} does"
                )
                + ")"
                + (f"; trace for tlparse: {self.trace}" if self.trace else "")
            )
        elif self.replay:
            lines.append(f"  replay   {self.replay} (no standalone repro: see the notes)")
        lines += [f"  note     {note}" for note in self.notes]
        return "\n".join(lines)


def _breaks_lines(graph_breaks: list[dict[str, Any]]) -> list[str]:
    """The breaks outside torch, a line each (torch's "graph break in loop" folded into the
    line's own reason), with their fixes."""
    lines: dict[str, dict[str, Any]] = {}
    for found in graph_breaks:
        if found.get("in_torch"):
            continue
        known = lines.get(found["location"])
        if known is None or known["reason"].startswith("graph break in loop"):
            lines[found["location"]] = found
    shown = [
        f"           {b['location']}: {_clip(b['reason'], 120)}"
        + (f"\n             fix {_verdict(b)}: {_clip(b['fix'], 200)}" if b.get("fix") else "")
        for b in list(lines.values())[:5]
    ]
    return [f"  breaks   {len(lines)} outside torch (your code, your libraries)", *shown]


def _recompiles_lines(recompiles: list[RecompileFinding]) -> list[str]:
    """Those training meets too, each with its guard; the others counted by cause."""
    recurring = [r for r in recompiles if r.recurs]
    lines = [
        f"  recompiles {len(recompiles)}"
        + (f", {len(recurring)} of a kind training meets too" if recompiles else ""),
        *(
            f"           RECURS {_clip(r.guard, 120)}\n             {_clip(r.why, 240)}"
            for r in recurring[:5]
        ),
    ]
    others: dict[str, list[RecompileFinding]] = {}
    for found in recompiles:
        if not found.recurs:
            others.setdefault(found.why, []).append(found)
    lines += [
        f"           {'once' if group[0].recurs is False else '?'} x{len(group)}"
        f" (e.g. {_clip(group[0].guard, 80)}): {_clip(why, 200)}"
        for why, group in others.items()
    ]
    return lines


def _verdict(graph_break: dict[str, Any]) -> str:
    """How far a break's fix was checked, in words."""
    verified = graph_break.get("fix_verified")
    if verified:
        return "(verified in a trial: the break is gone, eager unchanged)"
    if verified is False:
        return f"(did not check out: {graph_break.get('fix_check')})"
    return "(unverified)"


def _pays_line(pays: dict[str, Any]) -> str:
    """Whether the compile pays, said only as far as the paired interval supports it (the
    bench's rule: ``speedup_unquotable``)."""
    low, high = pays.get("low"), pays.get("high")
    shown = (
        f"compiled step {pays['speedup']:.2f}x eager's"
        + (f" ({low:.2f}-{high:.2f})" if low is not None and high is not None else "")
        + f"; compile {pays['compile_s']:.1f} s"
    )
    if pays.get("unquotable"):
        return (
            f"{shown}: not measurable here: {pays['unquotable']}; measure it with "
            "`torchcompile-kit bench --model ...` (more steps, --repeat, a quiet machine)"
        )
    if pays.get("payback_steps") is not None:
        return f"{shown}, paid back after ~{pays['payback_steps']} steps"
    if high is not None and high < 1:
        return (
            f"{shown}, never paid back: compiled is slower here (the reference post's reasons: "
            "a small or launch-bound model, graph breaks, recompiles); `torchcompile-kit tune` "
            "compares the recipes"
        )
    return (
        f"{shown}: no measurable gain (the interval includes 1x); `torchcompile-kit tune` "
        "compares the recipes"
    )


def _clip(text: str, width: int) -> str:
    """``text`` in at most ``width`` characters, cut at a word with "..." (never mid-word).

    Example:
        >>> _clip("Data-dependent branching on a tensor value", 30)
        'Data-dependent branching on...'
    """
    text = " ".join(text.split())
    if len(text) <= width:
        return text
    cut = text[: width - 3]
    if text[width - 3] != " ":  # inside a word: drop it
        cut = cut.rsplit(" ", 1)[0]
    return f"{cut.rstrip(',;: ')}..."
