"""The row one recipe produces, and the channel its process reports progress on.

Shared by the parent (:mod:`.runner`) and the recipe's process (:mod:`.execute`), so neither
imports the other's machinery.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

__all__ = ["EVENT_PREFIX", "RecipeResult", "emit_event", "set_event_sink"]

EVENT_PREFIX = "@@tck-event "
"""Stdout lines of the child that start with this carry one JSON progress event."""

Status = Literal["ok", "failed", "skipped"]


@dataclass(kw_only=True, slots=True)
class RecipeResult:
    """What one recipe run produced."""

    name: str
    """Recipe name (``"full"``)."""
    status: Status
    """``"ok"``, ``"failed"`` (raised, crashed or timed out) or ``"skipped"`` (cannot run here)."""
    metrics: dict[str, Any] = field(default_factory=dict)
    """The measurements (empty unless ``ok``); keys in :mod:`torchcompile_kit.bench.metrics`."""
    error: str | None = None
    """Failed: the exception and the tail of its traceback (or of the child's log)."""
    reason: str | None = None
    """Skipped: why (``"needs CUDA graphs; this machine has no CUDA device"``)."""
    group: str = ""
    """The recipe's group (``static``, ``dynamic``, ``warm-up``, ``distributed``, ``custom``)."""
    wall_s: float | None = None
    """Seconds the whole child process took (start-up and imports included)."""
    settings: dict[str, Any] = field(default_factory=dict)
    """What it ran with: preset, steps, backend, compile kwargs, device, model source."""

    def to_dict(self) -> dict[str, Any]:
        """The result as JSON-ready data."""
        return asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> RecipeResult:
        """Rebuild a result from :meth:`to_dict` data (unknown keys are ignored)."""
        known = set(cls.__dataclass_fields__)
        return cls(**{k: v for k, v in data.items() if k in known})


_event_sink: Callable[[dict[str, Any]], None] | None = None


def emit_event(**event: Any) -> None:
    """(In the child) report progress to the parent: one JSON line on stdout."""
    if _event_sink is not None:  # in-process mode
        _event_sink(event)
        return
    print(EVENT_PREFIX + json.dumps(event, default=str), flush=True)


def set_event_sink(sink: Callable[[dict[str, Any]], None] | None) -> None:
    """Deliver :func:`emit_event` events to ``sink`` in this process (``None``: to stdout)."""
    global _event_sink
    _event_sink = sink
