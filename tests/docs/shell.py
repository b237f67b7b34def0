"""The shell blocks of the docs: each command run, or checked the way its own tool would.

A block is split into commands with the standard library's ``shlex`` (``&&`` and ``;`` separate
commands, ``#`` starts a comment); each command then meets exactly one rule:

- ``pip install ...``: validated, never executed. Each requirement parses as a PEP 508
  requirement; a pinned torch satisfies the project's own ``torch`` requirement; ``-e ".[x]"``
  names this repository and extras that ``pyproject.toml`` declares.
- ``torchcompile-kit ...`` / ``python -m torchcompile_kit ...``: the commands in :data:`RUN`
  run for real (they take seconds); every other one takes minutes as written (a bench, a tune,
  a report of saved results) and is parsed with the CLI's own argument parser, its recipe and
  candidate names checked against the registries the CLI uses.
- ``python -m pytest ...``: the suite running this check; validated: its ``-m`` expression
  compiles and names only markers that ``pyproject.toml`` registers.
- ``tools/gpu_check.sh ...``: validated: every option is one its ``--help`` lists (it needs a GPU
  and minutes; ``tests/test_gpu_check.py`` runs what a CPU can).
- ``export NAME=VALUE``: validated: ``NAME`` is an environment variable the package reads (its
  name appears in the package's source), so a renamed variable fails its docs.
- anything else fails, naming the command, so a new kind of command gets a rule here.
"""

from __future__ import annotations

import itertools
import re
import shlex
import subprocess
import sys
from pathlib import Path

import tomllib
from packaging.requirements import Requirement

ROOT = Path(__file__).resolve().parents[2]
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())

# Commands that take seconds: run for real, from a scratch directory.
RUN = {("bench", "--list")}


def commands(source: str) -> list[list[str]]:
    """The commands of a shell block, each as argv (``&&``/``;`` split, comments dropped)."""
    found = []
    for line in source.replace("\\\n", " ").splitlines():
        lexer = shlex.shlex(line, posix=True, punctuation_chars=";&|")
        lexer.whitespace_split = True
        lexer.commenters = "#"
        argv: list[str] = []
        for token in lexer:
            if token in ("&&", ";"):
                found.append(argv)
                argv = []
            elif set(token) <= set(";&|"):
                raise AssertionError(
                    f"{token!r} in {line!r}: pipes and background jobs have no rule"
                )
            else:
                argv.append(token)
        if argv:
            found.append(argv)
    return [argv for argv in found if argv]


def check_block(source: str, cwd: Path) -> list[str]:
    """Run or validate every command of ``source``; returns what was done with each, in order."""
    return [check_command(argv, cwd) for argv in commands(source)]


def check_command(argv: list[str], cwd: Path) -> str:
    """``"ran: ..."``, ``"parsed: ..."`` or ``"validated: ..."``; raises AssertionError if wrong."""
    if argv[:2] == ["pip", "install"]:
        return _pip_install(argv[2:])
    if argv[0] == "torchcompile-kit":
        return _cli(argv[1:], argv, cwd)
    if argv[:3] == ["python", "-m", "torchcompile_kit"]:
        return _cli(argv[3:], argv, cwd)
    if argv[:3] == ["python", "-m", "pytest"]:
        return _pytest(argv[3:])
    if argv[0] == "export":
        return _export(argv[1:])
    if argv[0] == "tools/gpu_check.sh":
        return _gpu_check(argv[1:])
    raise AssertionError(
        f"no rule for the documented command {shlex.join(argv)!r}: add one to {__file__}"
    )


def _gpu_check(args: list[str]) -> str:
    script = ROOT / "tools" / "gpu_check.sh"
    usage = subprocess.run(
        ["bash", str(script), "--help"], capture_output=True, text=True, timeout=60, check=True
    ).stdout
    options = set(re.findall(r"--[\w-]+", usage))
    unknown = [arg for arg in args if arg.startswith("--") and arg not in options]
    assert not unknown, (
        f"tools/gpu_check.sh {shlex.join(args)}: no option {unknown!r} (it has {sorted(options)})"
    )
    return f"validated: tools/gpu_check.sh {shlex.join(args)}"


def _export(args: list[str]) -> str:
    assert len(args) == 1 and "=" in args[0], f"export {shlex.join(args)!r}: expected NAME=VALUE"
    name = args[0].split("=", 1)[0]
    source = "\n".join(p.read_text() for p in (ROOT / "torchcompile_kit").rglob("*.py"))
    assert f'"{name}"' in source, (
        f"export {name}: the package reads no environment variable {name!r}"
    )
    return f"validated: export {name}"


def _pip_install(args: list[str]) -> str:
    extras_declared = PYPROJECT["project"]["optional-dependencies"]
    torch_requirement = next(
        Requirement(r) for r in PYPROJECT["project"]["dependencies"] if r.startswith("torch")
    )
    editable = False
    for arg in args:
        if arg in ("-q", "-U", "--upgrade"):
            continue
        if arg == "-e":
            editable = True
            continue
        if editable:
            editable = False
            match = re.fullmatch(r"\.(?:\[(?P<extras>[\w,-]+)\])?", arg)
            assert match, f"pip install -e {arg!r}: expected this repository, '.[extra,...]'"
            for extra in (match["extras"] or "").split(","):
                assert not extra or extra in extras_declared, (
                    f"pip install -e {arg!r}: pyproject.toml declares no extra {extra!r} "
                    f"(it has {sorted(extras_declared)})"
                )
            continue
        assert not arg.startswith("-"), f"pip install option {arg!r} has no rule"
        requirement = Requirement(arg)  # raises InvalidRequirement for a malformed one
        if requirement.name == "torch":
            pinned = [s.version for s in requirement.specifier if s.operator == "=="]
            assert pinned, f"pip install {arg!r}: the docs pin the torch build ('torch==X')"
            assert torch_requirement.specifier.contains(pinned[0]), (
                f"pip install {arg!r}: outside the project's {str(torch_requirement)!r}"
            )
    return f"validated: pip install {shlex.join(args)}"


def _cli(args: list[str], argv: list[str], cwd: Path) -> str:
    from torchcompile_kit.cli import _parser

    if tuple(args) in RUN:
        result = subprocess.run(
            [sys.executable, "-m", "torchcompile_kit", *args],
            cwd=cwd,
            capture_output=True,
            text=True,
            timeout=300,
            check=False,
        )
        assert result.returncode == 0, (
            f"{shlex.join(argv)} exited {result.returncode}:\n{result.stderr}"
        )
        return f"ran: {shlex.join(argv)}"
    try:
        parsed = _parser().parse_args(args)
    except SystemExit as err:
        raise AssertionError(f"{shlex.join(argv)}: the CLI's parser refused it (exit {err.code})")
    if parsed.command == "bench" and parsed.recipes:
        from torchcompile_kit.bench.recipes import RECIPES

        unknown = [name for name in parsed.recipes if name not in RECIPES]
        assert not unknown, f"{shlex.join(argv)}: no recipe {unknown!r} (known: {sorted(RECIPES)})"
    if parsed.command == "tune" and parsed.candidates:
        from torchcompile_kit.tuning import CANDIDATES

        unknown = [name for name in parsed.candidates if name not in CANDIDATES]
        assert not unknown, f"{shlex.join(argv)}: no candidate {unknown!r}"
    return f"parsed: {shlex.join(argv)}"


def _pytest(args: list[str]) -> str:
    from _pytest.mark.expression import Expression  # pytest's own -m parser

    registered = {
        line.split(":")[0] for line in PYPROJECT["tool"]["pytest"]["ini_options"]["markers"]
    }
    for flag, value in itertools.pairwise(args):
        if flag == "-m":
            Expression.compile(value)  # raises ParseError for a malformed expression
            names = set(re.findall(r"\b\w+\b", value)) - {"and", "or", "not"}
            assert names <= registered, (
                f"pytest -m {value!r}: unregistered marker(s) {names - registered}"
            )
    return f"validated: python -m pytest {shlex.join(args)}"
