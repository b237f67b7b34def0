"""Every Python and shell example of README.md and docs/*.md, run (or checked) as written.

Sybil, a maintained documentation-testing tool, finds the examples: ```` ```python ```` blocks
(those that start with ``>>>`` as doctests), ```` ```bash ```` blocks, and two directives in HTML
comments, which a rendered page does not show:

- ``<!-- skip: next "reason" -->`` (Sybil's own): the next block is reported as skipped, with
  the reason;
- ``<!-- docs-test: slow (why) -->``: the next block is marked ``slow`` (it compiles with
  inductor: it runs under ``pytest -m slow``, not under README's ``-m "not slow"``).

Each block is one test, run from a scratch working directory in a fresh namespace holding the
imports of the page's earlier blocks (as a reader's session would have them) and tiny stand-ins
for the names the page leaves to the reader (``pages.py``). A block whose first line is a
``# torchrun ...`` comment is saved under the name it gives and started with that command
(marked ``distributed`` and ``slow``). Shell blocks: ``shell.py`` says which commands run and
which are validated or parsed. Fences without a language (directory trees, sample output) hold
no example and are not collected.
"""

from __future__ import annotations

import ast
import os
import re
import shlex
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from integrations.spawn import free_port
from sybil import Example, Region, Sybil
from sybil.evaluators.python import PythonEvaluator
from sybil.evaluators.skip import Skipper
from sybil.parsers.markdown import CodeBlockParser, PythonCodeBlockParser, SkipParser
from sybil.parsers.markdown.lexers import DirectiveInHTMLCommentLexer

from . import shell
from .pages import SETUP, StandIns

ROOT = Path(__file__).resolve().parents[2]
PAGES = ["README.md", *(f"docs/{path.name}" for path in sorted((ROOT / "docs").glob("*.md")))]
MARKS = {"slow": pytest.mark.slow, "distributed": pytest.mark.distributed}
TORCHRUN = re.compile(r"^# (?P<command>torchrun .+\.py)\s*$", re.MULTILINE)


# --- parsing: Sybil's parsers, plus the docs-test directive ------------------------------------


def _run_python(example: Example) -> None:
    """Sybil's Python evaluator, or the block's own ``# torchrun ...`` command."""
    first_line = str(example.parsed).lstrip().split("\n", 1)[0]
    launch = TORCHRUN.match(first_line)
    if launch is None:
        PythonEvaluator()(example)
        return
    argv = shlex.split(launch["command"])
    Path(argv[-1]).write_text(str(example.parsed))
    env = {**os.environ, "PET_MASTER_ADDR": "127.0.0.1", "PET_MASTER_PORT": str(free_port())}
    result = subprocess.run(
        [str(Path(sys.executable).parent / "torchrun"), *argv[1:]],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert result.returncode == 0, (
        f"{launch['command']} exited {result.returncode}:\n{result.stdout[-3000:]}\n"
        f"{result.stderr[-6000:]}"
    )


class _PythonParser(PythonCodeBlockParser):
    """Sybil's Python parser (code blocks and ``>>>`` doctests), evaluated by
    :func:`_run_python`."""

    @staticmethod
    def codeblock_parser_class(language: str, evaluator: Any) -> CodeBlockParser:
        return CodeBlockParser(language, _run_python)


def _run_shell(example: Example) -> None:
    shell.check_block(str(example.parsed), Path.cwd())


def _mark_directive(example: Example) -> None:
    """``docs-test`` directives act at collection (marks); evaluating them does nothing."""


class _MarkParser:
    """``<!-- docs-test: slow (why) -->`` before a block, read with Sybil's directive lexer."""

    lexer = DirectiveInHTMLCommentLexer(directive="docs-test", arguments=".+?")

    def __call__(self, document: Any):
        for lexed in self.lexer(document):
            words = lexed.lexemes["arguments"].split("(", 1)[0].split()
            unknown = [w for w in words if w not in MARKS]
            if unknown or not words:
                raise ValueError(
                    f"{document.path}: docs-test marks {unknown or words!r}, "
                    f"expected some of {sorted(MARKS)}"
                )
            yield Region(lexed.start, lexed.end, tuple(words), _mark_directive)


SYBIL = Sybil(
    parsers=[
        _PythonParser(),
        CodeBlockParser("bash", _run_shell),
        SkipParser(),
        _MarkParser(),
    ]
)


# --- collecting: one test per block --------------------------------------------------------------


@dataclass
class Block:
    page: str
    example: Example
    text: str  # the block as the page shows it (for the names it uses)
    directives: list[Example] = field(default_factory=list)
    imports: list[str] = field(default_factory=list)  # of the page's earlier Python blocks

    @property
    def id(self) -> str:
        return f"{self.page}:{self.example.line}"


def _imports(source: str) -> str:
    try:
        tree = ast.parse(source)
    except SyntaxError:  # a signature, shown as code: skipped, and imports nothing
        return ""
    return "\n".join(
        ast.unparse(node) for node in tree.body if isinstance(node, (ast.Import, ast.ImportFrom))
    )


def _page_blocks(page: str, document: Any) -> list[Any]:
    params = []
    directives: list[Example] = []
    imports: list[str] = []
    for example in document.examples():
        evaluator = example.region.evaluator
        if isinstance(evaluator, Skipper) or evaluator is _mark_directive:
            directives.append(example)
            continue
        text = document.text[example.start : example.end]
        block = Block(page, example, text, directives, list(imports))
        marks = [
            MARKS[w] for d in directives if d.region.evaluator is _mark_directive for w in d.parsed
        ]
        if evaluator is _run_python and TORCHRUN.match(str(example.parsed).lstrip()):
            marks += [pytest.mark.distributed, pytest.mark.slow]
        params.append(pytest.param(block, id=block.id, marks=marks))
        if evaluator is _run_python:
            imports.append(_imports(str(example.parsed)))
        directives = []
    return params


def _blocks() -> list[Any]:
    return [param for page in PAGES for param in _page_blocks(page, SYBIL.parse(ROOT / page))]


BLOCKS = _blocks()


@pytest.mark.parametrize("block", BLOCKS)
def test_block(block: Block, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    namespace = block.example.document.namespace
    namespace.clear()
    for source in block.imports:
        exec(compile(source, block.page, "exec"), namespace)  # noqa: S102 (the page's imports)
    stand_ins = StandIns(block.page, tmp_path, namespace)
    for name in stand_ins.names() & set(re.findall(r"\b[A-Za-z_]\w*\b", block.text)):
        namespace[name] = stand_ins[name]
    undo = [
        setup(tmp_path)
        for (page, needle), setup in SETUP.items()
        if page == block.page and needle in block.text
    ]
    try:
        for directive in block.directives:
            directive.evaluate()
        block.example.evaluate()
    finally:
        for step in undo:
            step()
        namespace.clear()


def test_every_page_is_collected() -> None:
    """Every ```python and ```bash block of every page is collected: none lost to a parsing slip."""
    pages = {param.values[0].page for param in BLOCKS}
    assert pages >= {"README.md", "docs/index.md", "docs/optimizer.md", "docs/peft.md"}, pages
    for page in PAGES:
        document = SYBIL.parse(ROOT / page)
        text = document.text
        starts = [param.values[0].example.start for param in _page_blocks(page, document)]
        for fence in re.finditer(r"^```(?:python|bash)\s*$", text, re.MULTILINE):
            closing = text.index("\n```", fence.end())
            assert any(fence.start() <= start <= closing for start in starts), (
                page,
                text[fence.start() : fence.start() + 80],
            )
