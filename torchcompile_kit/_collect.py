"""What is made inside a ``with`` block, collected: the one mechanism behind
``regional.regions_created()`` (a compile call's regions) and
``diagnostics.first_call_checks_made()`` (the checks a background worker reports). It lives in the
ground because both topics use it.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Generic, TypeVar

__all__ = ["Collector"]

T = TypeVar("T")


class Collector(Generic[T]):
    """Gives each item :meth:`add` sees to the list of every :meth:`collecting` block open then.

    Example:
        >>> made = Collector()
        >>> with made.collecting() as items:
        ...     made.add("a")
        >>> made.add("b")  # no block open: kept nowhere
        >>> items
        ['a']
    """

    def __init__(self) -> None:
        self._open: list[list[T]] = []

    def add(self, item: T) -> None:
        for items in self._open:
            items.append(item)

    @contextlib.contextmanager
    def collecting(self) -> Iterator[list[T]]:
        """A list of what is added while the block runs (nested blocks each get it)."""
        items: list[T] = []
        self._open.append(items)
        try:
            yield items
        finally:
            self._open.remove(items)
