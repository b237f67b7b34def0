"""What :class:`~torchcompile_kit.CompileMonitor` records, and the parsers that read torch's
structured-trace texts into it (graph-break artifacts, recompile-limit failures; verified on torch
2.13). Where a text does not match, the raw text is kept rather than guessed.
"""

from __future__ import annotations

import inspect
import os
import re
from dataclasses import asdict, dataclass, field
from typing import Any

__all__ = [
    "RESUME_PREFIX",
    "CompileCounts",
    "CompiledFrame",
    "FirstCallCheck",
    "GraphBreak",
    "LimitHit",
    "MonitorRecord",
    "Recompile",
    "code_label",
    "graph_sources",
    "owner_of",
    "parse_graph_break",
    "parse_limit_hit",
    "short_reason",
]

RESUME_PREFIX = "torch_dynamo_resume_in_"
"""Dynamo names the code after a graph break ``torch_dynamo_resume_in_<fn>_at_<line>``."""
LIMIT_PREFIX = "Dynamo recompile limit exceeded"


@dataclass(kw_only=True, slots=True)
class _InCode:
    """Where a record happened: a code object dynamo compiled, and whose it is."""

    function: str
    """The code's name (``forward``, ``torch_dynamo_resume_in_forward_at_42``)."""
    file: str | None = None
    """File of the code."""
    line: int | None = None
    """First line of the code."""
    compile_id: str = ""
    """Dynamo's id of the compile (``"3/1"``: frame 3, second compile). Restarts after ``reset()``.
    """
    owner: str | None = None
    """The module class the code belongs to (``GPT2Block``), once attributed."""
    region: str | None = None
    """The marked region whose call was running when dynamo compiled it
    (:func:`~torchcompile_kit.diagnostics.mark_region`; a ``compile_regional`` block group)."""

    @property
    def location(self) -> str:
        """``file:line`` of the code."""
        return f"{self.file}:{self.line}"


@dataclass(kw_only=True, slots=True)
class CompiledFrame(_InCode):
    """One frame (code object) dynamo compiled: one entry of its cache."""

    graphs: int = 0
    """Graphs the backend compiled for this frame (0 when every op ran eagerly)."""
    ops: int | None = None
    """Operators in the graph (dynamo's ``graph_op_count``)."""
    seconds: float = 0.0
    """Forward compile seconds (dynamo + backend), as torch measured them."""
    backward_seconds: float = 0.0
    """Backward compile seconds (AOTAutograd compiles the backward on the first backward)."""
    recompile_reason: str | None = None
    """The guard that failed when this compile was a recompile, in ``TORCH_LOGS`` words."""
    failed: str | None = None
    """Why the compile failed (then the frame runs eagerly), first line of torch's reason."""
    sources: list[tuple[str, int]] = field(default_factory=list)
    """``(file, line)`` of the user code in the graph; used to attribute wrapper frames."""

    @property
    def label(self) -> str:
        """How the summary names the frame: ``GPT2Block.forward`` or ``f (resumed at line 11)``."""
        return code_label(self.function, self.owner)

    def as_dict(self) -> dict[str, Any]:
        """JSON-serialisable fields (``sources`` left out: they are an attribution aid)."""
        data = asdict(self)
        data.pop("sources")
        data["location"] = self.location
        return data


@dataclass(kw_only=True, slots=True)
class GraphBreak:
    """A graph break: dynamo stopped the graph at a line of user code and ran it eagerly."""

    reason: str
    """In plain words: the break type and torch's explanation."""
    file: str | None = None
    """User file of the line that broke the graph."""
    line: int | None = None
    """User line that broke the graph."""
    code: str | None = None
    """torch's graph-break code (``GB0059``), where torch gives one."""
    hints: list[str] = field(default_factory=list)
    """torch's hints for this break."""
    function: str | None = None
    """The compiled frame the break happened in."""
    compile_id: str = ""
    """Dynamo's id of that frame compile."""
    count: int = 1
    """How often the same break (line and reason) was met while recording."""
    frame: int | None = None
    """Index of that frame in the monitor's ``frames``, where it was recorded."""
    modules: list[str] = field(default_factory=list)
    """Paths of the modules whose code it is in (``layers.0`` ... ; by
    ``explain_graph_breaks`` on a module): the instances of :attr:`owner`."""
    owner: str | None = None
    """The module class it belongs to, once attributed."""
    region: str | None = None
    """The marked region it happened in (see :attr:`CompiledFrame.region`)."""

    @property
    def location(self) -> str:
        """``file:line`` of the user code."""
        return f"{self.file}:{self.line}"

    @property
    def in_torch(self) -> bool:
        """Whether the break is in torch's own code (``torch/optim``'s explicit ``graph_break()``):
        by design there, not the user's to fix."""
        return is_torch_file(self.file)

    def as_dict(self) -> dict[str, Any]:
        """JSON-serialisable fields."""
        return {**asdict(self), "location": self.location}


@dataclass(kw_only=True, slots=True)
class Recompile(_InCode):
    """A frame compiled again because a guard of its earlier graph(s) failed (``compile_id``: the
    new compile's)."""

    reason: str = ""
    """The failed guard of the most recent graph, in ``TORCH_LOGS=recompiles`` words."""
    reasons: list[str] = field(default_factory=list)
    """The failed guards of every earlier graph of this code (most recent first)."""
    frame: int | None = None
    """Index of the new frame in the monitor's ``frames``."""

    @property
    def guard(self) -> str:
        """The guard that failed for this recompile, in one line, each kind of failure once.

        A call recompiles only when every earlier graph refused it, so dynamo logs one failed
        guard per earlier graph. Those of one kind (the same guard with other numbers: each
        bucket's graph refusing a new length) are named once, the most recent with a count of
        the others; a different kind is named too, since the most recent graph's guard alone can
        name the wrong cause (a new length shown as the ``requires_grad`` guard of a frozen
        block's graph).

        Example:
            >>> reasons = [
            ...     "0/2: tensor 'x' size mismatch at index 1. expected 64, actual 96",
            ...     "0/1: tensor 'x' size mismatch at index 1. expected 48, actual 96",
            ...     "0/0: tensor 'x' size mismatch at index 1. expected 32, actual 96"]
            >>> recompile = Recompile(file="m.py", line=1, function="f", reasons=reasons)
            >>> recompile.guard  # doctest: +NORMALIZE_WHITESPACE
            "0/2: tensor 'x' size mismatch at index 1. expected 64, actual 96 (and 2 earlier graphs
            alike)"
        """
        kinds: dict[str, list[str]] = {}
        for reason in self.reasons or [self.reason]:
            short = short_reason(reason)
            if short:
                kinds.setdefault(_guard_kind(short), []).append(short)
        shown = [
            f"{same[0]} (and {len(same) - 1} earlier graph{'s' * (len(same) > 2)} alike)"
            if len(same) > 1
            else same[0]
            for same in kinds.values()
        ]
        return "; ".join(shown) or short_reason(self.reason)

    def as_dict(self) -> dict[str, Any]:
        """JSON-serialisable fields."""
        return {**asdict(self), "guard": self.guard, "location": self.location}


@dataclass(kw_only=True, slots=True)
class FirstCallCheck:
    """A fragile recipe compared its first compiled call (in one state) with eager.

    Made by ``compile_regional``, ``compile_model``, ``compile_peft`` and ``compile_optimizer`` (see
    ``verify=`` on each); a ``"failed"`` one was raised as ``CompiledMismatchError``.
    """

    recipe: str
    """The recipe that checked itself (``"compile_regional"``)."""
    status: str
    """``"passed"`` (everything in ``compared`` matched, and that is everything the state has:
    outputs, and gradients when grad mode is on), ``"partial"`` (what was compared matched, but a
    part that should have run could not: ``note`` says which, and a warning was given),
    ``"failed"`` or ``"skipped"`` (``note`` says why)."""
    state: str
    """The call's state (``"train mode, grad on"``, an adapter state, ``"first compiled step"``)."""
    torch_version: str
    backend: str
    compared: list[str] = field(default_factory=list)
    """What was compared: ``outputs``, ``gradients`` (a model; ``gradients (<where>)`` when a
    background worker compared them on the same batch); ``updates``, ``state`` (a step)."""
    tensors: int = 0
    """Tensors compared."""
    failures: int = 0
    """Tensors the comparator judged wrong."""
    max_abs: float = 0.0
    """The largest absolute difference over every compared tensor."""
    worst: str = ""
    """The tensor that used the most of its allowance."""
    worst_ratio: float = 0.0
    """How much of its allowance it used (at most 1 passes; :attr:`TensorDiff.ratio`)."""
    reference: str = ""
    """What the tensors were judged against: the reference's dtype (``"float64"``, ``"float32"``:
    eager at that precision, autocast off), or ``"none (<why>)"`` (the dtype's fixed tolerance)."""
    check_seconds: float = 0.0
    """Time the check added: the eager reference (forward, backward) and the comparison."""
    compiled_seconds: float = 0.0
    """Time of the compiled call (its compile included) and, with gradients, of the compiled
    backward's first run (its compile, which the user's ``backward()`` then skips)."""
    note: str = ""
    """Why it was skipped, or what was not compared."""

    def message(self) -> str:
        """One line: recipe, state, verdict, the largest difference, the cost."""
        share = (
            f", {self.check_seconds:.3g} s check vs {self.compiled_seconds:.3g} s compiled call "
            f"({self.check_seconds / self.compiled_seconds:.1%})"
            if self.compiled_seconds
            else ""
        )
        what = "+".join(self.compared) or "nothing"
        against = (
            f", {self.reference} reference"
            if self.reference in ("float64", "float32")
            else f", reference {self.reference}"
            if self.reference
            else ""
        )
        verdict = (
            f"{self.status.upper()} ({what}, {self.tensors} tensors{against}, max diff "
            f"{self.max_abs:.3g}{share})"
        )
        if self.status == "skipped":
            verdict = f"SKIPPED{share and ' (' + share[2:] + ')'}"
        tail = f": {self.note}" if self.note else ""
        return (
            f"first-call check {self.recipe} [{self.state}] on torch {self.torch_version} "
            f"({self.backend}): {verdict}{tail}"
        )

    def as_dict(self) -> dict[str, Any]:
        """JSON-serialisable fields."""
        return asdict(self)


@dataclass(kw_only=True, slots=True)
class LimitHit(_InCode):
    """Dynamo gave up on a code object: from now on it runs eagerly, and torch says nothing more
    (``compile_id``: the refused compile's)."""

    limit: int | None = None
    """The limit that was hit (8 by default)."""
    limit_type: str | None = None
    """Which limit: ``recompile_limit`` or ``accumulated_recompile_limit``."""
    last_reason: str | None = None
    """The guard failure that asked for one compile too many."""

    def message(self) -> str:
        """A loud one-paragraph explanation with the fix."""
        return (
            f"RECOMPILE LIMIT HIT: {self.function} ({self.file}:{self.line}) reached "
            f"{self.limit_type or 'recompile_limit'}={self.limit}; it now runs EAGERLY for "
            "every new variant and torch will not say so again. Last failing guard: "
            f"{short_reason(self.last_reason)}. Fix the cause (pad shapes to buckets, mark "
            "dims dynamic, make per-instance state a tensor) or raise the limit for this "
            "function only with torch.compile(..., recompile_limit=N)."
        )

    def as_dict(self) -> dict[str, Any]:
        """JSON-serialisable fields."""
        return {**asdict(self), "location": self.location}


def is_torch_file(file: str | None) -> bool:
    """Whether ``file`` belongs to the installed torch package.

    Example:
        >>> import torch, os
        >>> is_torch_file(os.path.join(os.path.dirname(torch.__file__), "optim", "optimizer.py"))
        True
    """
    if not file:
        return False
    import torch

    root = os.path.dirname(os.path.abspath(torch.__file__)) + os.sep
    return os.path.abspath(file).startswith(root)


def short_reason(text: str | None) -> str:
    """A guard failure in one line: the first line, the padding before its ``#`` comment cut.

    Example:
        >>> short_reason("0/0: len(args) == 2      # return f(*args)  # m.py:3 in f\\nUser stack")
        '0/0: len(args) == 2  # return f(*args)  # m.py:3 in f'
    """
    first = (text or "").strip().split("\n", 1)[0]
    return re.sub(r"\s{2,}#", "  #", first)


def _guard_kind(short: str) -> str:
    """A failed guard without its compile id and numbers: what two graphs' failures share."""
    return re.sub(r"\d+", "N", re.sub(r"^\d+/\d+:\s*", "", short))


def code_label(function: str, owner: str | None = None) -> str:
    """A readable name for compiled code: ``GPT2Block.forward``, ``f (resumed at line 11)``.

    Example:
        >>> code_label("torch_dynamo_resume_in_forward_at_12")
        'forward (resumed at line 12)'
    """
    name = function
    if name.startswith(RESUME_PREFIX):
        base, _, at = name[len(RESUME_PREFIX) :].rpartition("_at_")
        name = f"{base} (resumed at line {at})"
        return f"{owner}: {name}" if owner else name
    if owner:  # a wrapper installed as cls.forward shows as the class's forward
        return f"{owner}.forward" + ("" if name == "forward" else f" (via {name})")
    return name


_BREAK_AT = re.compile(r"Graph break in user code at (?P<file>.+):(?P<line>\d+)\s*$", re.MULTILINE)
_TRACEBACK_LINE = re.compile(r'File "(?P<file>[^"]+)", line (?P<line>\d+)')
_GB_CODE = re.compile(r"/gb/(gb\d+)\.html", re.IGNORECASE)
_LIMIT = re.compile(r"currently set to (?P<limit>\d+)")
_LIMIT_TYPE = re.compile(r"Limit type: (?P<type>\w+)")
# torch 2.10 and earlier: a bare "recompile_limit reached" (or "accumulated_recompile_limit
# reached"), with the limit only in the warning dynamo logs beside it
_LIMIT_REACHED = re.compile(r"^(?P<type>\w*recompile_limit) reached")
_GRAPH_SOURCE = re.compile(r"# File: (?P<file>.+?):(?P<line>\d+) in ")


def parse_graph_break(payload: str) -> GraphBreak:
    """Read a ``dynamo_graph_break_reason`` artifact into a :class:`GraphBreak`.

    Example:
        >>> text = ("Graph break in user code at /m.py:7\\nGraph Break Reason: ...\\n\\n"
        ...         "Failed to trace builtin operator\\n  Explanation: `print` ...\\n")
        >>> parse_graph_break(text).location
        '/m.py:7'
    """
    head, _, _ = payload.partition("User code traceback:")
    where = _BREAK_AT.search(head)
    if where:
        file, line = where["file"], int(where["line"])
    else:  # "cannot properly resume ... skip": the user code is a traceback
        frames = list(_TRACEBACK_LINE.finditer(head))
        file, line = (frames[-1]["file"], int(frames[-1]["line"])) if frames else (None, None)
    lines = head.splitlines()
    kind, explanation, hints = None, None, []
    for index, text in enumerate(lines):
        stripped = text.strip()
        if stripped.startswith("Explanation:"):
            explanation = stripped.removeprefix("Explanation:").strip()
            previous = [t.strip() for t in lines[:index] if t.strip()]
            kind = previous[-1].removeprefix("Graph Break Reason:").strip() if previous else None
        elif stripped.startswith("Hint:"):
            hints.append(stripped.removeprefix("Hint:").strip())
    if kind and explanation:
        reason = f"{kind}: {explanation}"
    else:
        body = [t.strip() for t in lines if t.strip() and not _BREAK_AT.match(t.strip())]
        reason = " ".join(body[:2])[:500] or payload.strip()[:500]
    code = _GB_CODE.search(payload)
    return GraphBreak(
        reason=reason, file=file, line=line, code=code[1].upper() if code else None, hints=hints
    )


def parse_limit_hit(fail_reason: str | None) -> tuple[int | None, str | None] | None:
    """``(limit, limit_type)`` if ``fail_reason`` is a recompile-limit failure, else ``None``.

    Example:
        >>> parse_limit_hit("Dynamo recompile limit exceeded ... (currently set to 8) ... "
        ...                 "Limit type: recompile_limit")
        (8, 'recompile_limit')
        >>> parse_limit_hit("recompile_limit reached")  # torch <= 2.10: no number in the text
        (None, 'recompile_limit')
    """
    if fail_reason and (reached := _LIMIT_REACHED.match(fail_reason)):
        return (None, reached["type"])
    if not fail_reason or not fail_reason.startswith(LIMIT_PREFIX):
        return None
    limit = _LIMIT.search(fail_reason)
    kind = _LIMIT_TYPE.search(fail_reason)
    return (int(limit["limit"]) if limit else None, kind["type"] if kind else None)


def graph_sources(payload: str, *, cap: int = 400) -> list[tuple[str, int]]:
    """The distinct ``(file, line)`` pairs named by ``# File:`` comments of a printed FX graph.

    Example:
        >>> graph_sources("# File: /m.py:3 in f, code: y = x + 1\\n# File: /m.py:3 in f")
        [('/m.py', 3)]
    """
    seen: dict[tuple[str, int], None] = {}
    for match in _GRAPH_SOURCE.finditer(payload):
        seen.setdefault((match["file"], int(match["line"])), None)
        if len(seen) >= cap:
            break
    return list(seen)


def owner_of(
    function: str,
    file: str | None,
    line: int | None,
    sources: list[tuple[str, int]],
    classes: list[type],
) -> str | None:
    """The one class among ``classes`` whose ``forward`` the frame runs: its own ``forward``, a
    wrapper installed as ``cls.forward`` (told apart by the graph's ``sources``), or code resumed
    after a break inside it; ``None`` when none or several fit.

    Example:
        >>> owner_of("forward", __file__, 1, [], [])  # no classes: nobody owns it
    """
    if file is None or line is None:
        return None
    exact, inside = [], []
    for cls in classes:
        forward = getattr(cls, "forward", None)
        code = getattr(forward, "__code__", None)
        real = getattr(inspect.unwrap(forward), "__code__", None) if forward is not None else None
        if code is None or real is None:
            continue
        last = max((ln for _, _, ln in real.co_lines() if ln), default=real.co_firstlineno)
        span = (real.co_filename, real.co_firstlineno, last)
        if (code.co_name, code.co_filename, code.co_firstlineno) == (function, file, line):
            exact.append((cls, span))
        elif file == span[0] and span[1] <= line <= span[2]:
            inside.append((cls, span))
    if sources:  # a wrapper (one code for every block class): did the graph trace this forward?
        exact = [
            (c, s)
            for c, s in exact
            if s[:2] == (file, line) or any(f == s[0] and s[1] <= ln <= s[2] for f, ln in sources)
        ]
    if exact:
        names = {cls.__name__ for cls, _ in exact}
        return names.pop() if len(names) == 1 else None
    if inside:  # resumed code: the innermost forward that contains the line
        return min(inside, key=lambda item: item[1][2] - item[1][1])[0].__name__
    return None


@dataclass(kw_only=True, frozen=True, slots=True)
class CompileCounts:
    """The flat counts of a record, or of a part of it (:meth:`CompileMonitor.snapshot`)."""

    frames: int
    graphs: int
    graph_breaks: int
    """Distinct graph breaks."""
    graph_breaks_met: int
    """Graph breaks, each time it was met."""
    recompiles: int
    compile_seconds: float
    recompile_limit_hits: int
    cache_hits: int
    cache_misses: int

    def as_dict(self) -> dict[str, Any]:
        """JSON-serialisable fields."""
        return asdict(self)


@dataclass(kw_only=True, frozen=True, slots=True)
class MonitorRecord:
    """A part of a :class:`CompileMonitor`'s record: what belongs to a model, a module class, an
    optimizer or a function (:meth:`CompileMonitor.record_for`), or what dynamo compiled while a
    marked region ran (:meth:`CompileMonitor.record_for_region`)."""

    counts: CompileCounts
    frames: list[CompiledFrame]
    graph_breaks: list[GraphBreak]
    recompiles: list[Recompile]
    limit_hits: list[LimitHit]
    compile_seconds_by_function: dict[str, float]
    """Compile seconds per ``label @ file:line``, forward and backward, largest first."""
    cache: dict[str, int]
    """The whole monitor's compile-cache counters (not split by part)."""
    notes: list[str]

    def as_dict(self) -> dict[str, Any]:
        """JSON-serialisable: each event as its own ``as_dict``."""
        return {
            "counts": self.counts.as_dict(),
            "frames": [f.as_dict() for f in self.frames],
            "graph_breaks": [b.as_dict() for b in self.graph_breaks],
            "recompiles": [r.as_dict() for r in self.recompiles],
            "limit_hits": [h.as_dict() for h in self.limit_hits],
            "compile_seconds_by_function": dict(self.compile_seconds_by_function),
            "cache": dict(self.cache),
            "notes": list(self.notes),
        }
