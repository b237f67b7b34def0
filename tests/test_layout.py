"""The layout of docs/architecture.md, enforced: import rules, one door to torch internals.

- ``lint-imports`` (import-linter, contracts in ``pyproject.toml``): layers, no circles, data
  modules import no siblings. A planted violation in a copy of the package must fail it.
- No ``_private`` name crosses a folder, and across folders only the folder's own API is imported
  (``from ..regional import compile_regional``, never ``from ..regional.plan import ...``):
  import-linter cannot express these, so a small AST check does.
- Only the ``_dynamo/`` folder touches torch's private compiler APIs.
"""

from __future__ import annotations

import ast
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "torchcompile_kit"
GROUND = {"errors", "_compat", "_checks", "_dynamo"}
LINT_IMPORTS = Path(sys.executable).parent / "lint-imports"


def _lint_imports(cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [str(LINT_IMPORTS), "--config", "pyproject.toml", "--no-cache"],
        check=False,
        cwd=cwd,
        capture_output=True,
        text=True,
        env={"PYTHONPATH": str(cwd), "PATH": str(LINT_IMPORTS.parent)},
        timeout=120,
    )


def test_import_contracts_are_kept():
    result = _lint_imports(ROOT)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "broken" in result.stdout and " 0 broken" in result.stdout


@pytest.mark.parametrize(
    ("module", "planted", "contract"),
    [
        ("regional/plan.py", "from ..bench import RECIPES", "layers"),
        ("shapes/planner.py", "from ..regional import compile_regional", "layers"),
        ("_checks.py", "from . import _dynamo", "layers"),
        ("errors.py", "from . import _checks", "layers"),
        ("adapters/rule_table.py", "from .evaluation import rule_by_id", "rule table is data"),
    ],
)
def test_a_planted_violation_breaks_the_contracts(tmp_path, module, planted, contract):
    shutil.copytree(
        PACKAGE, tmp_path / "torchcompile_kit", ignore=shutil.ignore_patterns("__pycache__")
    )
    shutil.copy(ROOT / "pyproject.toml", tmp_path / "pyproject.toml")
    target = tmp_path / "torchcompile_kit" / module
    source = target.read_text()
    marker = "from __future__ import annotations\n"
    target.write_text(source.replace(marker, f"{marker}\n{planted}  # planted\n", 1))
    result = _lint_imports(tmp_path)
    assert result.returncode != 0, result.stdout
    assert _status(result.stdout, contract) == "BROKEN", result.stdout


def _status(output: str, contract: str) -> str:
    """KEPT or BROKEN for the contract whose name starts with ``contract``."""
    text = " ".join(output.split())  # names wrap across lines
    start = text.index(contract, text.index("Contracts"))
    return min(("KEPT", "BROKEN"), key=lambda word: text.find(word, start) % (len(text) + 1))


# --- names across folders --------------------------------------------------------------------


def _folder(path: Path) -> str:
    rel = path.relative_to(PACKAGE)
    if rel.parts == ("cli.py",):
        return "bench"  # the command line is the bench's front door (bench/ + cli.py)
    return rel.parts[0] if len(rel.parts) > 1 else ""


def _resolve(path: Path, node: ast.ImportFrom) -> list[str]:
    """The imported module as parts below the package (``["regional", "plan"]``)."""
    if node.level == 0:
        parts = (node.module or "").split(".")
        return parts[1:] if parts[0] == "torchcompile_kit" else []
    here = list(path.relative_to(PACKAGE).parent.parts)
    base = here[: len(here) - (node.level - 1)] if node.level > 1 else here
    return base + ((node.module or "").split(".") if node.module else [])


def crossing_violations(path: Path, source: str) -> list[str]:
    """Imports from another folder that name a private name or reach past its ``__init__``."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, ast.ImportFrom) or (
            node.level == 0 and not (node.module or "").startswith("torchcompile_kit")
        ):
            continue
        target = _resolve(path, node)
        if not target and node.level:  # "from .. import _dynamo" / "from .. import diagnostics"
            names = [alias.name for alias in node.names]
            found += [
                f"{path.name}:{node.lineno} imports {n}"
                for n in names
                if n not in GROUND and not (PACKAGE / n).is_dir()
            ]
            continue
        if not target or target[0] in GROUND or target[0] == _folder(path):
            continue
        where = f"{path.relative_to(PACKAGE)}:{node.lineno}"
        if len(target) > 1:
            found.append(
                f"{where} reaches into {'.'.join(target)} (import from {target[0]} itself)"
            )
        found += [f"{where} imports private {a.name}" for a in node.names if a.name.startswith("_")]
    return found


def _modules() -> list[Path]:
    return sorted(PACKAGE.rglob("*.py"))


def test_no_private_name_crosses_a_folder():
    found = [v for path in _modules() for v in crossing_violations(path, path.read_text())]
    assert found == []


def test_the_crossing_check_catches_planted_violations():
    plan = PACKAGE / "adapters" / "guard.py"
    assert crossing_violations(plan, "from ..regional.plan import register_undo\n")
    assert crossing_violations(plan, "from ..regional import _check_model\n")
    assert not crossing_violations(plan, "from ..regional import register_undo\n")
    assert not crossing_violations(plan, "from .evaluation import _something\n")  # same folder


# --- torch's private compiler APIs -------------------------------------------------------------

PRIVATE_ATTRIBUTES = {"_compiled_call_impl", "_call_impl"}


def private_torch_uses(source: str) -> list[str]:
    """Uses of ``torch._<name>`` (not the ``torch._foreach_*`` math ops) and of the private
    ``nn.Module`` attributes that hold a compiled call."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Attribute):
            if (
                isinstance(node.value, ast.Name)
                and node.value.id == "torch"
                and node.attr.startswith("_")
                and not node.attr.startswith(("_foreach_", "__"))
            ):
                found.append(f"line {node.lineno}: torch.{node.attr}")
            elif node.attr in PRIVATE_ATTRIBUTES:
                found.append(f"line {node.lineno}: .{node.attr}")
        elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("torch._"):
            found.append(f"line {node.lineno}: from {node.module}")
        elif isinstance(node, ast.Import):
            found += [
                f"line {node.lineno}: import {a.name}"
                for a in node.names
                if a.name.startswith("torch._")
            ]
    return found


def test_only_dynamo_module_touches_torch_internals():
    found = {
        str(path.relative_to(PACKAGE)): uses
        for path in _modules()
        if path.relative_to(PACKAGE).parts[0] != "_dynamo"
        and (uses := private_torch_uses(path.read_text()))
    }
    assert found == {}


def test_the_internals_check_catches_planted_uses():
    assert private_torch_uses("import torch\nx = torch._dynamo.config.recompile_limit\n")
    assert private_torch_uses("from torch._inductor.utils import fresh_cache\n")
    assert private_torch_uses("m._compiled_call_impl = None\n")
    assert not private_torch_uses("import torch\ntorch._foreach_add_(xs, 1)\ntorch.compile(f)\n")


def frame_inspection(source: str) -> list[str]:
    """Where ``source`` reads the live call stack (``sys._getframe``, ``inspect.currentframe`` or
    ``inspect.stack``, a frame's ``f_back``): how the sampler once guessed who iterated it. (An
    exception's traceback, walked to name what an error is about, is not the live stack.)"""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Attribute) and (
            node.attr in ("_getframe", "currentframe", "f_back")
            or (
                node.attr == "stack"
                and isinstance(node.value, ast.Name)
                and node.value.id == "inspect"
            )
        ):
            found.append(f"line {node.lineno}: .{node.attr}")
    return found


def test_no_module_reads_its_callers_frames():
    found = {
        str(path.relative_to(PACKAGE)): uses
        for path in _modules()
        if (uses := frame_inspection(path.read_text()))
    }
    assert found == {}


def test_the_frame_check_catches_planted_uses():
    assert frame_inspection("import sys\ncaller = sys._getframe(1)\n")
    assert frame_inspection("import inspect\nframes = inspect.stack()\n")
    assert frame_inspection("frame = frame.f_back\n")
    assert not frame_inspection("import torch\ntorch.stack(xs)\n")
