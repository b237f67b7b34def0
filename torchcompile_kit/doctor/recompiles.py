"""Why the triage recompiled, and whether training would keep recompiling for the same reason:
each failed guard (dynamo's ``TORCH_LOGS=recompiles`` words) read as a cause."""

from __future__ import annotations

import re
from dataclasses import dataclass

__all__ = ["RecompileFinding", "explain_recompile"]

_NUMBER_GUARD = re.compile(r"(==|!=|<=|>=|<|>)\s*-?\d")

_MODE = (
    "grad mode or train/eval changed: the doctor's own switch (its check runs eval forwards under "
    "no_grad, then trains); in your run, once at each switch to or from evaluation"
)
_SHAPE = (
    "a shape that changes between batches: training meets it too, as the lengths change (by "
    "default torch recompiles once more with the dim dynamic; with dynamic=False at every new "
    "shape); pad to a few buckets (plan_buckets) or mark the dim dynamic (mark_dynamic_batch)"
)
_REQUIRES_GRAD = (
    "requires_grad changed (an input with gradients where one had none, or parameters frozen or "
    "unfrozen): once per combination, not per batch"
)
_STRUCTURE = (
    "a module or object that differs between calls (each block's own submodule or attribute "
    "under regional compile): once per distinct one, not per batch"
)
_VALUE = (
    "a Python number that changes between calls (an int or float from the batch, such as a "
    "token count, or a .item()): training meets it too, whenever it changes (by default torch "
    "recompiles an int once more as dynamic; a number it keeps static, at every new value); "
    "pass it as a tensor"
)
_WORDS: dict[str, tuple[bool, str]] = {
    "mode": (False, _MODE),
    "shape": (True, _SHAPE),
    "requires_grad": (False, _REQUIRES_GRAD),
    "structure": (False, _STRUCTURE),
    "value": (True, _VALUE),
}
"""Each kind of failed guard: whether training meets it per batch, and the cause in words."""


@dataclass(frozen=True, slots=True)
class RecompileFinding:
    """One recompile of the triage, read."""

    guard: str
    """The failed guard(s), as :attr:`~torchcompile_kit.diagnostics.Recompile.guard` gives them."""
    kinds: tuple[str, ...]
    """What changed, per failed guard: ``mode``, ``shape``, ``requires_grad``, ``structure``,
    ``value``, or ``other``."""
    recurs: bool | None
    """``True``: training meets it too, whenever a batch changes that thing (a shape, a value;
    by default torch then recompiles once more with it dynamic, or at every new value where it
    stays static); ``False``: not per batch (the doctor's own eval/train switch, a frozen
    parameter, a distinct block); ``None``: the guard is of no kind read here."""
    why: str
    """The cause in words, with what to do about one that recurs."""


def _kind(part: str) -> str:
    if "grad_mode" in part or ".training ==" in part or "training ==" in part:
        return "mode"
    if "size mismatch" in part or "stride mismatch" in part or ".size()" in part:
        return "shape"
    if "requires_grad" in part:
        return "requires_grad"
    if "_modules[" in part or "___check_obj_id" in part or "___check_type_id" in part:
        return "structure"
    if _NUMBER_GUARD.search(part.split("  #", 1)[0]):
        return "value"
    return "other"


def explain_recompile(guard: str) -> RecompileFinding:
    """Read one recompile's failed guard: what changed, and whether it recurs in training.

    Example:
        >>> shape = explain_recompile("0/0: tensor 'x' size mismatch at index 0. expected 6")
        >>> shape.kinds, shape.recurs
        (('shape',), True)
        >>> explain_recompile("0/0: GLOBAL_STATE changed: grad_mode").kinds
        ('mode',)
    """
    parts = [p for p in re.split(r";\s+(?=\d+/\d+: )", guard) if p.strip()] or [guard]
    kinds = tuple(dict.fromkeys(_kind(part) for part in parts))
    read = [kind for kind in kinds if kind != "other"]
    if not read:
        return RecompileFinding(guard=guard, kinds=kinds, recurs=None, why="see the guard")
    read.sort(key=lambda kind: not _WORDS[kind][0])  # what recurs first: the cause to act on
    recurs = _WORDS[read[0]][0]
    why = "; ".join(_WORDS[kind][1] for kind in read)
    return RecompileFinding(guard=guard, kinds=kinds, recurs=recurs, why=why)
