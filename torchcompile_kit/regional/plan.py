"""The regional plan: which blocks are compiled, which modules stay eager (data only).

Also the one undo registry: everything a helper installs next to an in-place compile (the
``use_cache`` hook, the pinned loss, ``compile_peft``'s runtime checks) registers how to remove it
with :func:`register_undo`, and :func:`~torchcompile_kit.uncompile` runs them in reverse.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from torch import nn

__all__ = ["BlockGroup", "RegionalPlan", "get_regional_plan", "register_undo", "run_undo"]

PLAN_ATTR = "_torchcompile_kit_plan"
UNDO_ATTR = "_torchcompile_kit_undo"


@dataclass(kw_only=True, slots=True)
class BlockGroup:
    """Modules of one class compiled with the same settings."""

    class_name: str
    """Name of the blocks' class (``"GPT2Block"``)."""
    names: list[str]
    """Qualified names as in ``model.named_modules()``."""
    selector: str = "auto"
    """What chose them: ``"auto"`` (discovery) or the ``blocks=`` selector's repr."""
    compile_kwargs: dict[str, Any] = field(default_factory=dict)
    """Keyword arguments given to ``module.compile()`` for this group."""


@dataclass(kw_only=True, slots=True)
class RegionalPlan:
    """What ``compile_regional`` compiles and what stays eager.

    Example:
        >>> plan = find_repeated_blocks(model)  # doctest: +SKIP
        >>> plan.summary()  # doctest: +SKIP
        'compiled 12 × GPT2Block; eager: transformer.wte, transformer.wpe, ...'
    """

    groups: list[BlockGroup]
    """Blocks to compile, grouped by class (and by selector when ``blocks=`` is a mapping)."""
    eager: list[str]
    """The largest modules that contain no block: they run eagerly (unless ``remainder=True``)."""
    remainder: list[str] = field(default_factory=list)
    """Eager modules compiled as their own regions (``compile_regional(..., remainder=True)``)."""

    @property
    def blocks(self) -> list[str]:
        """Qualified names of every block that is (or will be) compiled, group by group."""
        return [name for group in self.groups for name in group.names]

    def summary(self) -> str:
        """One line: ``compiled 12 × GPT2Block; eager: transformer.wte, lm_head``."""
        compiled = ", ".join(f"{len(g.names)} × {g.class_name}" for g in self.groups)
        line = f"compiled {compiled}"
        if self.remainder:
            line += f"; also compiled: {', '.join(self.remainder)}"
        eager = [name for name in self.eager if name not in self.remainder]
        return f"{line}; eager: {', '.join(eager) if eager else '(none)'}"


def get_regional_plan(model: nn.Module) -> RegionalPlan | None:
    """The plan ``compile_regional`` recorded on ``model``, or ``None`` if it was not called.

    Example:
        >>> get_regional_plan(compile_regional(model)).summary()  # doctest: +SKIP
        'compiled 12 × GPT2Block; eager: transformer.wte, transformer.wpe, ...'
    """
    return getattr(model, PLAN_ATTR, None)


def register_undo(model: nn.Module, undo: Callable[[], None]) -> None:
    """Run ``undo`` when :func:`~torchcompile_kit.uncompile` is called on ``model``.

    For helpers that install something next to an in-place compile (hooks, wrapped methods).
    Undos run in reverse order of registration.

    Example:
        >>> handle = model.register_forward_pre_hook(hook)  # doctest: +SKIP
        >>> register_undo(model, handle.remove)  # doctest: +SKIP
    """
    model.__dict__.setdefault(UNDO_ATTR, []).append(undo)


def run_undo(model: nn.Module) -> None:
    """Run and forget every undo registered on ``model``, last first."""
    for undo in reversed(model.__dict__.pop(UNDO_ATTR, [])):
        undo()
