"""A live progress display per recipe: ``rich`` on a terminal (the ``bench`` extra), else a line
per phase and a step line at most every ``interval_s`` seconds, and an estimate of what remains.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from types import TracebackType
from typing import TYPE_CHECKING, Any

from .._compat import is_package_available

if TYPE_CHECKING:  # Python 3.11's typing.Self, for the annotation only
    from typing import Self

__all__ = ["BenchProgress"]


class BenchProgress:
    """Progress of a bench run: one line per recipe with its phase and step bar.

    Example:
        >>> with BenchProgress(total_recipes=2) as progress:  # doctest: +SKIP
        ...     on_event = progress.start("eager")
        ...     on_event({"event": "step", "step": 1, "total": 25, "phase": "warm-up"})
        ...     progress.finish("eager", "ok 12.3 steps/s")
    """

    def __init__(
        self, *, total_recipes: int, enabled: bool = True, interval_s: float = 30.0
    ) -> None:
        self.total = total_recipes
        self.done = 0
        self.interval_s = interval_s
        self._started = time.monotonic()
        self._recipe_started = self._started
        self._last_line = self._started
        self.use_rich = enabled and is_package_available("rich") and sys.stderr.isatty()
        self.enabled = enabled
        self._progress: Any = None
        self._task: Any = None

    def __enter__(self) -> Self:
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

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self._progress is not None:
            self._progress.__exit__(exc_type, exc, tb)

    def start(self, name: str) -> Callable[[dict[str, Any]], None]:
        """Announce recipe ``name``; returns the ``on_event`` callback for its runner."""
        label = f"[{self.done + 1}/{self.total}] {name}"
        self._recipe_started = self._last_line = time.monotonic()
        if self._progress is not None:
            self._task = self._progress.add_task("", total=None, label=label, phase="starting")
        elif self.enabled:
            print(f"{label}: starting", file=sys.stderr, flush=True)

        def on_event(event: dict[str, Any]) -> None:
            if event.get("event") == "phase":
                self._update(phase=str(event.get("phase")))
                self._line(label, str(event.get("phase")), force=True)
            elif event.get("event") == "step":
                self._update(
                    completed=event.get("step"),
                    total=event.get("total"),
                    phase=str(event.get("phase")),
                )
                step, total = event.get("step"), event.get("total")
                self._line(label, f"{event.get('phase')} step {step}/{total}", force=step == total)

        return on_event

    def _update(self, **fields: Any) -> None:
        if self._progress is not None and self._task is not None:
            self._progress.update(self._task, **fields)

    def _line(self, label: str, what: str, *, force: bool) -> None:
        """A plain progress line (no terminal): every phase, a step at most every interval_s."""
        if self._progress is not None or not self.enabled:
            return
        now = time.monotonic()
        if not force and now - self._last_line < self.interval_s:
            return
        self._last_line = now
        print(f"{label}: {what} ({now - self._recipe_started:.0f} s)", file=sys.stderr, flush=True)

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
            print(self.eta(), file=sys.stderr, flush=True)

    def eta(self) -> str:
        """Elapsed time, and the remaining time estimated from the recipes so far (recipes differ:
        an estimate, said as one).

        Example:
            >>> BenchProgress(total_recipes=3, enabled=False).eta()
            '0 of 3 recipes done, 0.0 min elapsed'
        """
        elapsed = time.monotonic() - self._started
        text = f"{self.done} of {self.total} recipes done, {elapsed / 60:.1f} min elapsed"
        if 0 < self.done < self.total:
            remaining = elapsed / self.done * (self.total - self.done)
            text += f"; about {remaining / 60:.0f} min more if the rest take as long as these"
        return text
