"""Fixes for graph breaks in the user's code that the doctor can check: the line rewritten as
docs/troubleshooting.md says, applied to the model's class in a trial of its own, and verified
there (the break gone, eager's loss unchanged on the batch).

Two rewrites are known: a ``print`` (or logging call) guarded by
``torch.compiler.is_compiling()``, and an ``if`` on a ``.item()`` whose branches assign
(``torch.where``). Any other break keeps torch's own hint, marked unverified.
"""

from __future__ import annotations

import ast
import inspect
import linecache
import textwrap
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = ["Rewrite", "apply_rewrite", "propose_rewrite"]

_LOGGING = ("builtin operator `print`", "logging", "Logger")


@dataclass(frozen=True, slots=True)
class Rewrite:
    """A rewrite of the statement at ``file:line`` that removes a graph break."""

    file: str
    line: int
    kind: str
    """``logging`` (guard the call) or ``item-branch`` (``torch.where`` for an ``if``)."""
    shown: str
    """The new code, as the user would write it."""


def propose_rewrite(file: str, line: int, reason: str) -> Rewrite | None:
    """The rewrite for the break at ``file:line`` with dynamo's ``reason``, or ``None`` when no
    known rewrite fits or the file is an installed package's (then torch's hint stands,
    unverified).

    Example:
        >>> propose_rewrite("model.py", 12, "Unsupported Tensor.item() call")  # doctest: +SKIP
        Rewrite(file='model.py', line=12, kind='item-branch',
                shown='h = torch.where(h.mean() > 0, h * 2, h)')
    """
    kind = (
        "logging"
        if any(word in reason for word in _LOGGING)
        else "item-branch"
        if "Tensor.item()" in reason or "Data-dependent branching" in reason
        else None
    )
    if kind is None or _installed(file):
        return None
    source = "".join(linecache.getlines(file))
    if not source:
        return None
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return None
    found = _rewrite_at(tree, line, kind)
    if found is None:
        return None
    shown = "\n".join(ast.unparse(node) for node in found[1])
    return Rewrite(file=file, line=line, kind=kind, shown=shown)


def _installed(file: str) -> bool:
    """``file`` belongs to an installed package (transformers, peft, ...): not the user's to
    rewrite, so its break keeps torch's hint."""
    parts = Path(file).parts
    return "site-packages" in parts or "dist-packages" in parts


def apply_rewrite(model: Any, rewrite: dict[str, Any]) -> str:
    """Replace, on its class, the method of a module of ``model`` that holds the rewrite's line
    by the same method with that statement rewritten; return the method's name
    (``Block.forward``). In the doctor's trial process only: the class stays patched there.

    Raises:
        LookupError: no method of the model's modules holds that line, or the statement there is
            not one the rewrite fits.
    """
    import torch

    file, line, kind = rewrite["file"], rewrite["line"], rewrite["kind"]
    for cls, name, fn in _methods(model):
        code = fn.__code__
        if code.co_filename != file or set(code.co_freevars) - {"__class__"}:
            continue
        lines, first = inspect.getsourcelines(fn)
        if not first <= line < first + len(lines):
            continue
        tree = ast.parse(textwrap.dedent("".join(lines)))
        ast.increment_lineno(tree, first - 1)
        found = _rewrite_at(tree, line, kind)
        if found is None:
            raise LookupError(f"{file}:{line}: the statement there is not one a {kind} fix fits")
        _replace(tree, *found)
        # defined inside a function with a __class__ local, so that super() finds its class
        maker = ast.parse(f"def _make(__class__):\n    pass\n    return {fn.__name__}").body[0]
        maker.body[0:1] = tree.body
        namespace = dict(fn.__globals__)
        namespace["torch"] = torch
        module = ast.fix_missing_locations(ast.Module(body=[maker], type_ignores=[]))
        exec(compile(module, file, "exec"), namespace)  # noqa: S102 - the user's code, rewritten
        setattr(cls, name, namespace["_make"](cls))
        return f"{cls.__name__}.{name}"
    raise LookupError(f"{file}:{line}: no method of the model's modules holds this line")


def _methods(model: Any) -> list[tuple[type, str, Callable[..., Any]]]:
    found, seen = [], set()
    for module in model.modules():
        for cls in type(module).__mro__:
            if cls.__module__.startswith("torch.") or cls in seen:
                continue
            seen.add(cls)
            for name, fn in vars(cls).items():
                if inspect.isfunction(fn):
                    found.append((cls, name, fn))
    return found


def _statement_at(tree: ast.AST, line: int) -> ast.stmt | None:
    """The innermost statement that starts at ``line``."""
    found = None
    for node in ast.walk(tree):
        starts = isinstance(node, ast.stmt) and node.lineno == line
        if starts and (found is None or node.col_offset > found.col_offset):
            found = node
    return found


def _rewrite_at(tree: ast.AST, line: int, kind: str) -> tuple[ast.stmt, list[ast.stmt]] | None:
    """The statement at ``line`` and what the ``kind`` of rewrite makes of it, or ``None``."""
    statement = _statement_at(tree, line)
    new = _rewritten(statement, kind) if statement is not None else None
    return None if new is None else (statement, new)


def _rewritten(statement: ast.stmt, kind: str) -> list[ast.stmt] | None:
    if kind == "logging" and isinstance(statement, ast.Expr):
        guard = ast.parse("if not torch.compiler.is_compiling():\n    pass").body[0]
        guard.body = [statement]
        return [ast.fix_missing_locations(ast.copy_location(guard, statement))]
    if kind == "item-branch" and isinstance(statement, ast.If):
        return _where(statement)
    return None


def _where(branch: ast.If) -> list[ast.stmt] | None:
    """``if c.item() > 0: h = a  else: h = b`` as ``h = torch.where(c > 0, a, b)``; ``None``
    unless each branch only assigns names, each once, none reading another's new value."""
    then, other = _assigned(branch.body), _assigned(branch.orelse)
    if then is None or other is None or not then:
        return None
    names = list(dict.fromkeys([*then, *other]))
    test = _WithoutItem().visit(ast.parse(ast.unparse(branch.test), mode="eval").body)
    statements = []
    for name in names:
        value = ast.parse(f"{name} = torch.where(__test, __then, __else)", mode="exec").body[0]
        call = value.value
        keep = ast.Name(name, ctx=ast.Load())
        call.args = [test, then.get(name, keep), other.get(name, keep)]
        statements.append(ast.fix_missing_locations(ast.copy_location(value, branch)))
    return statements


def _assigned(body: list[ast.stmt]) -> dict[str, ast.expr] | None:
    found: dict[str, ast.expr] = {}
    for statement in body:
        if not (
            isinstance(statement, ast.Assign)
            and len(statement.targets) == 1
            and isinstance(statement.targets[0], ast.Name)
        ):
            return None
        name = statement.targets[0].id
        read = {n.id for n in ast.walk(statement.value) if isinstance(n, ast.Name)}
        if name in found or read & set(found):
            return None
        found[name] = statement.value
    return found


class _WithoutItem(ast.NodeTransformer):
    """``x.item()`` as ``x``: the comparison stays a tensor, as ``torch.where`` takes it."""

    def visit_Call(self, node: ast.Call) -> ast.AST:
        self.generic_visit(node)
        func = node.func
        if isinstance(func, ast.Attribute) and func.attr == "item" and not node.args:
            return func.value
        return node


def _replace(tree: ast.AST, old: ast.stmt, new: list[ast.stmt]) -> None:
    for node in ast.walk(tree):
        for field in ("body", "orelse", "finalbody"):
            block = getattr(node, field, None)
            if isinstance(block, list) and old in block:
                at = block.index(old)
                block[at : at + 1] = new
                return
