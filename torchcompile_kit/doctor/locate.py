"""Where in the module tree a problem lives: top-down, a part compiled alone with the rest eager,
repeated blocks tried as one group, and the answer confirmed both ways."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from torch import nn

from .record import Trial, TrialKind, TrialOutcome

__all__ = ["Located", "Unit", "children", "locate"]

_CONTAINERS = (nn.ModuleList, nn.ModuleDict, nn.Sequential)


@dataclass(frozen=True, slots=True)
class Unit:
    """A part of the model compiled as one: a module, or every instance of a repeated block."""

    label: str
    """``transformer.h.*.mlp`` (``*``: every repeated block), or the module's path."""
    paths: tuple[str, ...]
    """The modules' paths in the model."""
    class_name: str
    """Their class."""

    def describe(self) -> str:
        """``transformer.h.*.mlp (GPT2MLP x 2)``."""
        count = f" x {len(self.paths)}" if len(self.paths) > 1 else ""
        return f"{self.label} ({self.class_name}{count})"


def children(model: nn.Module, unit: Unit) -> list[Unit]:
    """The parts one level below ``unit``, each across every instance of ``unit``: its children,
    with the members of a container (``ModuleList``, ``Sequential``) grouped by class, so that
    repeated blocks are one part (``h.*``).

    Example:
        >>> net = nn.Sequential(nn.Linear(2, 2), nn.ReLU())
        >>> [u.label for u in children(net, Unit(label="", paths=("",), class_name="Sequential"))]
        ['0', '1']
    """
    first = model.get_submodule(unit.paths[0])
    if isinstance(first, _CONTAINERS):
        return _grouped(unit.label, unit.paths, first)
    found: list[Unit] = []
    for name, child in first.named_children():
        label, paths = _join(unit.label, name), tuple(_join(p, name) for p in unit.paths)
        if isinstance(child, _CONTAINERS) and len(child):
            found += _grouped(label, paths, child)
            continue
        by_class: dict[type, list[str]] = {}  # repeated blocks whose child differs in class
        for path in paths:
            by_class.setdefault(type(model.get_submodule(path)), []).append(path)
        for cls, members in by_class.items():
            if cls is nn.Identity:  # nothing to compile
                continue
            shown = (
                label
                if len(by_class) == 1
                else (members[0] if len(members) == 1 else f"{label} <{cls.__name__}>")
            )
            found.append(Unit(label=shown, paths=tuple(members), class_name=cls.__name__))
    return found


def _join(base: str, name: str) -> str:
    return f"{base}.{name}" if base else name


def _grouped(label: str, paths: tuple[str, ...], container: nn.Module) -> list[Unit]:
    """A container's members as parts: one per class, ``label.*`` when the class repeats."""
    by_class: dict[type, list[str]] = {}
    for member, module in container.named_children():
        by_class.setdefault(type(module), []).append(member)
    units = []
    for cls, members in by_class.items():
        shown = _join(label, "*" if len(members) > 1 else members[0])
        units.append(
            Unit(
                label=shown,
                class_name=cls.__name__,
                paths=tuple(_join(p, m) for p in paths for m in members),
            )
        )
    return units


@dataclass(kw_only=True, slots=True)
class Located:
    """What localisation found."""

    culprits: list[Unit]
    """The smallest parts that reproduce it alone (empty: nothing smaller than the whole model)."""
    whole_graph_only: bool
    """No part alone reproduces it, only the whole model compiled at once (no culprits)."""
    indivisible: bool
    """The culprit reproduces alone, but none of its parts alone does (it has parts)."""
    confirmed: bool
    """The culprits alone fail and the model compiled with them eager passes."""
    complement: TrialOutcome | None
    """The confirming trial (everything compiled but the culprits)."""


def locate(
    model: nn.Module, run: Callable[[Trial], TrialOutcome], base: Trial, *, max_trials: int = 40
) -> Located:
    """Descend from the whole model while exactly one part reproduces the problem alone.

    ``run`` runs a trial; ``base`` is the failing trial's settings (backend, compile kwargs,
    inductor settings). At each level every part is compiled alone with the rest eager: one part
    failing is descended into; none failing leaves the current part as the answer, reproducing
    only as a whole; several failing are each an answer. Then the model is compiled with the
    answer left eager, which must pass. ``max_trials`` bounds the descent.
    """
    node = Unit(label="", paths=("",), class_name=type(model).__name__)
    culprits: list[Unit] = []
    whole = False
    spent = 0
    while True:
        parts = children(model, node)
        if not parts:  # a leaf: nothing smaller to try (the model itself: no part to name)
            culprits = [node] if node.label else []
            break
        failing = []
        for part in parts:
            if spent >= max_trials:
                break
            spent += 1
            outcome = run(base.variant(TrialKind.ALONE, part.describe(), modules=list(part.paths)))
            if outcome.bad:
                failing.append(part)
        if len(failing) == 1:
            node = failing[0]
            continue
        if failing:
            culprits = failing
        else:
            culprits, whole = ([node] if node.label else []), True
        break
    if not culprits:
        return Located(
            culprits=[], whole_graph_only=True, indivisible=False, confirmed=False, complement=None
        )
    paths = [p for unit in culprits for p in unit.paths]
    complement = run(
        base.variant(
            TrialKind.EVERYTHING_BUT,
            ", ".join(u.label for u in culprits),
            modules=None,
            exclude=paths,
        )
    )
    return Located(
        culprits=culprits,
        whole_graph_only=False,
        indivisible=whole and bool(children(model, culprits[0])),
        confirmed=not complement.bad and complement.status != "eager-error",
        complement=complement,
    )
