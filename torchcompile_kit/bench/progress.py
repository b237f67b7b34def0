"""A live progress display per recipe: ``rich`` when installed (the ``bench`` extra), else plain
lines. The runner's children report their phases and steps as events; this turns them into a bar.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from types import TracebackType
from typing import Any

from .._compat import is_package_available

__all__ = ["BenchProgress"]


class BenchProgress:
    """Progress of a bench run: one line per recipe with its phase and step bar.

    Example:
        >>> with BenchProgress(total_recipes=2) as progress:  # doctest: +SKIP
        ...     on_event = progress.start("eager")
        ...     on_event({"event": "step", "step": 1, "total": 25, "phase": "warm-up"})
        ...     progress.finish("eager", "ok 12.3 steps/s")
    """

    def __init__(self, *, total_recipes: int, enabled: bool = True) -> None:
        self.total = total_recipes
        self.done = 0
        self.use_rich = enabled and is_package_available("rich") and sys.stderr.isatty()
        self.enabled = enabled
        self._progress: Any = None
        self._task: Any = None

    def __enter__(self) -> BenchProgress:
        if self.use_rich:
            from rich.progress import (
                BarColumn,
                MofNCompleteColumn,
                Progress,
                TextColumn,
                TimeElapsedColumn,
            )

            self._progress = Progress(
                TextColumn("[bold]{task.fields[label]}"),
                BarColumn(),
                MofNCompleteColumn(),
                TextColumn("{task.fields[phase]}"),
                TimeElapsedColumn(),
                transient=False,
            )
            self._progress.__enter__()
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        if self._progress is not None:
            self._progress.__exit__(exc_type, exc, tb)

    def start(self, name: str) -> Callable[[dict[str, Any]], None]:
        """Announce recipe ``name``; returns the ``on_event`` callback for its runner."""
        label = f"[{self.done + 1}/{self.total}] {name}"
        if self._progress is not None:
            self._task = self._progress.add_task("", total=None, label=label, phase="starting")
        elif self.enabled:
            print(f"{label}: starting", file=sys.stderr, flush=True)

        def on_event(event: dict[str, Any]) -> None:
            if event.get("event") == "phase":
                self._update(phase=str(event.get("phase")))
            elif event.get("event") == "step":
                self._update(
                    completed=event.get("step"), total=event.get("total"), phase=str(event.get("phase"))
                )

        return on_event

    def _update(self, **fields: Any) -> None:
        if self._progress is not None and self._task is not None:
            self._progress.update(self._task, **fields)

    def finish(self, name: str, summary: str) -> None:
        """Mark recipe ``name`` finished with a one-line ``summary``."""
        self.done += 1
        if self._progress is not None and self._task is not None:
            self._progress.update(self._task, phase=summary)
            task = self._progress.tasks[-1]
            if task.total is None:
                self._progress.update(self._task, total=1, completed=1)
        elif self.enabled:
            print(f"[{self.done}/{self.total}] {name}: {summary}", file=sys.stderr, flush=True)
