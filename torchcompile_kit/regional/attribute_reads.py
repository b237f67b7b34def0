"""What a block class's methods do with ``self.<attribute>``, read from their source: only handed
on (``cache.update(..., self.layer_idx)``: no specialization) or decided on (a graph per value).
"""

from __future__ import annotations

import ast
import functools
import inspect
import re
import textwrap

from torch import nn

__all__ = ["DECIDES", "PASSED_ON", "attribute_uses"]

PASSED_ON = "passed"
"""The attribute is handed on as an argument (to a cache, a helper): not decided on here."""
DECIDES = "decides"
"""The attribute is used itself (an index, a branch, arithmetic): dynamo specializes on it."""


def _uses(source: str, attribute: str) -> set[str]:
    """How ``self.<attribute>`` is used in ``source``: handed on as an argument, or used itself."""
    try:
        tree = ast.parse(textwrap.dedent(source))
    except SyntaxError:
        return {DECIDES}  # cannot tell: assume the worst
    parents = {child: node for node in ast.walk(tree) for child in ast.iter_child_nodes(node)}
    uses = set()
    for node in ast.walk(tree):
        if not (
            isinstance(node, ast.Attribute)
            and node.attr == attribute
            and isinstance(node.value, ast.Name)
            and node.value.id == "self"
            and isinstance(node.ctx, ast.Load)
        ):
            continue
        parent = parents.get(node)
        passed = isinstance(parent, ast.keyword) or (
            isinstance(parent, ast.Call) and node in parent.args
        )
        uses.add(PASSED_ON if passed else DECIDES)
    return uses


@functools.cache
def attribute_uses(cls: type, attribute: str) -> frozenset[str]:
    """How the methods of ``cls`` (other than ``__init__``) use ``self.<attribute>``; empty if
    unread."""
    pattern = re.compile(rf"\bself\.{re.escape(attribute)}\b")
    uses: set[str] = set()
    for klass in cls.__mro__:
        if klass in (nn.Module, object):
            break
        for name, member in vars(klass).items():
            if name in ("__init__", "extra_repr") or not inspect.isfunction(member):
                continue
            try:
                source = inspect.getsource(member)
            except (OSError, TypeError):
                return frozenset({DECIDES})  # cannot tell: assume it is read and used
            if pattern.search(source):
                uses |= _uses(source, attribute)
    return frozenset(uses)
