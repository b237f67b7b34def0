"""The one procedure every "compiled = eager?" check follows.

A check (the first-call check, ``check_compile_equivalence``, ``compile_optimizer``'s first step,
tune's gate, the doctor's trials through ``check_compile_equivalence``) supplies only how it runs
its two sides, as :class:`Sides`: the eager result, the compiled result, how to run the eager side
again at a given precision, and, where it can, how to rerun both from the same start. The procedure,
:func:`compare`, owns the rest, in the same order for all:

1. judge every tensor (:mod:`.comparator`); a tensor within rounding of eager passes as it is;
2. where one is not, run the reference: the eager side at the precision of the one rule
   (:func:`~.reference.reference_dtype`: float64 for float32 runs, float32 for 16-bit weights or
   autocast), autocast off; a side that cannot run there leaves the fixed tolerance, and says why;
3. where a tensor still fails, measure the run-to-run noise (eager against eager, compiled against
   compiled, from the same start) and judge again;
4. return a :class:`Verdict` (the tensors, the reference, what was measured), from which the record
   and the error message are made (:func:`make_record`, :func:`mismatch_message`).

Random numbers are the procedure's too: every side starts from the same generator state
(:func:`rng_state`, :func:`fork_rng`), a draw is known from the generator's state after the eager
side (:func:`rng_moved`), never from whether outputs happened to differ, and the compiled side of
a call that drew runs under :func:`same_draws` (inductor's ``fallback_random``), so both draw the
same numbers; a compiled side that still drew its own way leaves the generator elsewhere than
eager did, which a check can measure.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from .. import _dynamo
from .comparator import NEAR_EPS, TensorDiff, judge_trees, needs_reference, rms_differences
from .reference import Reference
from .trace_records import FirstCallCheck

__all__ = [
    "ReferenceUnavailable",
    "Rerun",
    "Sides",
    "Verdict",
    "backend_name",
    "compare",
    "fork_rng",
    "make_record",
    "mismatch_message",
    "random_note",
    "rng_moved",
    "rng_state",
    "same_draws",
    "set_rng_state",
]

Judge = Callable[..., list[TensorDiff]]
"""``judge(eager, compiled, exact, reference_name, *, tolerance=None, noise=None)``."""


def _judge_trees(
    eager: Any,
    compiled: Any,
    exact: Any,
    reference: str,
    *,
    tolerance: tuple[float, float] | None = None,
    noise: Mapping[str, float] | None = None,
) -> list[TensorDiff]:
    return judge_trees(
        "", eager, compiled, exact, reference_dtype=reference, tolerance=tolerance, noise=noise
    )


def _tree_distance(first: Any, second: Any) -> dict[str, float]:
    return rms_differences("", first, second)


class ReferenceUnavailable(Exception):
    """Raised by :attr:`Sides.reference` when its run cannot stand as the reference (a step that
    raised there): the message is the reason the record gives."""


@dataclass(kw_only=True, frozen=True, slots=True)
class Rerun:
    """Both sides again from the same start, for the noise."""

    eager: Any
    compiled: Any = None
    """``None``: the compiled side cannot be replayed (eager's noise only)."""
    said: str = ""
    """What was rerun, for the record's notes (empty: nothing to add)."""


@dataclass(kw_only=True, frozen=True, slots=True)
class Sides:
    """How one check's two sides ran and how to run them again; :func:`compare` decides when."""

    eager: Any
    """The eager side's result, as :attr:`judge` reads it (a tree of tensors by default)."""
    compiled: Any
    """The compiled side's result, alike."""
    reference: Callable[[torch.dtype], Any]
    """The eager side again at that precision, autocast off, from the same start; raises when it
    cannot (:class:`ReferenceUnavailable` for a reason of its own)."""
    precision: Reference
    """The reference precision, from :func:`~.reference.reference_dtype` (the one rule)."""
    rerun: Callable[[], Rerun] | None = None
    """Both sides again from the same start (the noise), where the check can."""
    judge: Judge = _judge_trees
    distance: Callable[[Any, Any], dict[str, float]] = _tree_distance
    """Per tensor name, the RMS difference between two results (the noise)."""
    subject: str = "the model"
    """What the reference runs, in the note of a reference that could not run."""


@dataclass(kw_only=True, slots=True)
class Verdict:
    """What :func:`compare` found."""

    diffs: list[TensorDiff]
    reference: Reference
    notes: list[str] = field(default_factory=list)
    """What the procedure measured beyond the first judging (the noise)."""

    @property
    def failures(self) -> list[TensorDiff]:
        return [d for d in self.diffs if not d.ok]

    def describe_reference(self) -> str:
        """A record's ``reference``: its dtype, ``none (why)``, or why none was needed (every
        tensor was rounding-level near eager)."""
        if not self.reference.needed:
            near = sum(d.judged_by == "eager" for d in self.diffs)
            if near < len(self.diffs):
                return (
                    f"not needed: {near} of {len(self.diffs)} tensors within {NEAR_EPS:g} "
                    "epsilons of eager, the others exact"
                )
            return f"not needed: every tensor within {NEAR_EPS:g} epsilons of eager"
        return self.reference.name or f"none ({self.reference.note})"


def compare(sides: Sides, *, tolerance: tuple[float, float] | None = None) -> Verdict:
    """Judge a check's two sides by the one procedure (the module's docstring).

    ``tolerance`` is a user's ``(rtol, atol)``: it replaces the rule, with no reference or noise.

    Example:
        >>> x = torch.tensor([1.0, 2.0])
        >>> sides = Sides(eager={"y": x}, compiled={"y": x + 1e-3},
        ...               reference=lambda dtype: {"y": x.to(dtype)},
        ...               precision=Reference(dtype=torch.float64))
        >>> verdict = compare(sides)
        >>> len(verdict.failures), verdict.describe_reference()
        (1, 'float64')
    """
    if tolerance is not None:
        rtol, atol = tolerance
        diffs = sides.judge(sides.eager, sides.compiled, None, "", tolerance=tolerance)
        return Verdict(
            diffs=diffs, reference=Reference(dtype=None, note=f"rtol={rtol}, atol={atol} given")
        )
    diffs = sides.judge(sides.eager, sides.compiled, None, "")
    exact, reference = None, Reference(dtype=None, needed=False)
    if needs_reference(diffs):  # not rounding-level near eager: ask the reference
        exact, reference = _reference(sides)
        diffs = sides.judge(sides.eager, sides.compiled, exact, reference.name)
    verdict = Verdict(diffs=diffs, reference=reference)
    if verdict.failures and sides.rerun is not None:
        again = sides.rerun()
        noise = sides.distance(sides.eager, again.eager)
        if again.compiled is not None:
            for name, value in sides.distance(sides.compiled, again.compiled).items():
                noise[name] = max(value, noise.get(name, 0.0))
        verdict.diffs = sides.judge(sides.eager, sides.compiled, exact, reference.name, noise=noise)
        verdict.notes += [again.said] if again.said else []
    return verdict


def _reference(sides: Sides) -> tuple[Any, Reference]:
    precision = sides.precision
    if precision.dtype is None:
        return None, precision
    try:
        return sides.reference(precision.dtype), precision
    except ReferenceUnavailable as why:
        return None, Reference(dtype=None, note=str(why))
    except Exception as error:  # noqa: BLE001 - a side that cannot run at that precision
        return None, Reference(
            dtype=None,
            note=f"{sides.subject} does not run in {precision.name}: {_first_line(error)}",
        )


def _first_line(error: BaseException) -> str:
    text = str(error).strip()
    return f"{type(error).__name__}: {text.splitlines()[0] if text else ''}"[:200]


# --- random numbers ----------------------------------------------------------------------------

RngState = tuple[torch.Tensor, list[tuple[Any, int, torch.Tensor]]]


def _accelerator(model: nn.Module) -> tuple[str, list[int]] | None:
    accelerators = {p.device for p in model.parameters() if p.device.type != "cpu"}
    if not accelerators:
        return None
    device_type = next(iter(accelerators)).type
    return device_type, sorted({d.index or 0 for d in accelerators if d.type == device_type})


def rng_state(model: nn.Module) -> RngState:
    """The CPU's generator state and that of each accelerator ``model`` is on: what every side of
    a check starts from, so dropout draws the same masks in each."""
    found = _accelerator(model)
    if found is None:
        return torch.random.get_rng_state(), []
    module = torch.get_device_module(found[0])
    return torch.random.get_rng_state(), [(module, i, module.get_rng_state(i)) for i in found[1]]


def set_rng_state(state: RngState) -> None:
    torch.random.set_rng_state(state[0])
    for module, index, device_state in state[1]:
        module.set_rng_state(device_state, index)


def rng_moved(before: RngState, after: RngState) -> bool:
    """Whether a generator's state differs between two :func:`rng_state` readings: a run between
    them drew random numbers."""
    if not torch.equal(before[0], after[0]):
        return True
    return any(not torch.equal(a[2], b[2]) for a, b in zip(before[1], after[1]))


def fork_rng(model: nn.Module) -> Any:
    """``torch.random.fork_rng`` over the CPU and ``model``'s accelerators."""
    found = _accelerator(model)
    if found is None:
        return torch.random.fork_rng(devices=[])
    return torch.random.fork_rng(devices=found[1], device_type=found[0])


def backend_name(backend: Any) -> str:
    return backend if isinstance(backend, str) else getattr(backend, "__name__", repr(backend))


@contextlib.contextmanager
def same_draws(backend: str) -> Iterator[None]:
    """Inside, what compiles for ``backend`` draws eager's random numbers: inductor with
    ``fallback_random`` (torch's own random ops instead of its own generator); the others as
    they are."""
    settings = {"fallback_random": True} if backend == "inductor" else {}
    with _dynamo.inductor_settings(settings):
        yield


def random_note(backend: str) -> str:
    """What a record says of a check whose call drew random numbers (dropout)."""
    said = (
        "random numbers drawn (dropout): every run of the check started from the RNG state the "
        "compiled call started from"
    )
    if backend == "inductor":
        return said + (
            "; the graphs this call compiled use inductor's fallback_random (torch's own random "
            "ops), so they drew eager's numbers"
        )
    return said + (
        f", and backend {backend!r} drew the same ones (the generator ended where eager's run "
        "left it)"
    )


# --- the record ------------------------------------------------------------------------------


def make_record(
    recipe: str, backend: str, status: str, state: str, diffs: Any, **extra: Any
) -> FirstCallCheck:
    """A check's record from its tensors (``extra``: the record's other fields)."""
    worst = max(diffs, key=lambda d: d.ratio, default=None)
    return FirstCallCheck(
        recipe=recipe,
        status=status,
        state=state,
        torch_version=torch.__version__,
        backend=backend,
        tensors=len(diffs),
        failures=sum(1 for d in diffs if not d.ok),
        max_abs=max((d.max_abs for d in diffs), default=0.0),
        worst=worst.name if worst else "",
        worst_ratio=worst.ratio if worst else 0.0,
        **extra,
    )


def _judged(reference: str) -> str:
    if reference.startswith("none"):
        return (
            "judged by the fixed tolerance: no float64 reference, "
            f"{reference.removeprefix('none ')}"
        )
    return f"judged against eager in {reference}, autocast off"


def mismatch_message(
    record: FirstCallCheck, failures: list[TensorDiff], restored: bool = False
) -> str:
    """The ``CompiledMismatchError`` of a failed check: what differs, by how much, against what,
    and what to do."""
    worst = max(failures, key=lambda d: d.ratio)
    largest = max(failures, key=lambda d: d.max_abs)
    shown = ", ".join(d.name for d in failures[:5]) + (", ..." if len(failures) > 5 else "")
    kept = (
        "the parameters and state were restored to before the step"
        if restored
        else "the call raised before returning its result"
    )
    biggest = f"{largest.note}" if math.isinf(largest.max_abs) else f"{largest.max_abs:.3g}"
    return (
        f"{record.recipe} computed a different result than eager at its first call "
        f"({record.state}) on torch {record.torch_version}, backend {record.backend!r}: "
        f"largest difference {biggest} in {largest.name!r}; worst {worst.explain()}; "
        f"{len(failures)} of {record.tensors} tensors wrong: {shown} "
        f"({_judged(record.reference)}). "
        f"Nothing was trained on it ({kept}). "
        "This torch/backend "
        "miscomputes this recipe: use another recipe or backend (e.g. "
        "compile_regional(model) block by block), report it with "
        "check_compile_equivalence(...).summary(), or pass verify=False to run it anyway."
    )
