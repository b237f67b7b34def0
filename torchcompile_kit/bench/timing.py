"""What the micro-benchmarks (`torchcompile-kit micro regional|shapes|optimizer`) share: the result
type, timing, fresh compile state, a text table and JSON output."""

from __future__ import annotations

import contextlib
import datetime
import json
import os
import platform
import statistics
import subprocess
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from .. import _dynamo
from .._compat import package_version

__all__ = [
    "BenchResult",
    "environment",
    "format_table",
    "fresh_compile_state",
    "interleaved_medians",
    "timed",
    "write_json",
]


@dataclass(kw_only=True, slots=True)
class BenchResult:
    """One recipe's measurements."""

    recipe: str
    """Recipe name (``"regional"``)."""
    title: str
    """One line saying what was measured, on what."""
    columns: list[str]
    """Column order of the printed table."""
    rows: list[dict[str, Any]]
    """One dict per variant; keys are the columns."""
    summary: list[str] = field(default_factory=list)
    """Lines printed under the table: ratios and targets met or missed."""
    config: dict[str, Any] = field(default_factory=dict)
    """The sizes and settings the recipe ran with."""


def environment() -> dict[str, Any]:
    """Versions, machine and commit, recorded with every result."""
    import torch

    try:
        commit = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"],
            capture_output=True,
            text=True,
            check=False,
            cwd=Path(__file__).resolve().parent,
        ).stdout.strip()
    except OSError:
        commit = ""
    device = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "cpu"
    return {
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "git_commit": commit or None,
        "python": platform.python_version(),
        "platform": platform.platform(),
        "cpu_count": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "device": device,
        "torch": torch.__version__,
        **{name: str(package_version(name)) for name in ("transformers", "peft", "accelerate")},
    }


@contextlib.contextmanager
def fresh_compile_state() -> Iterator[None]:
    """A true cold start: dynamo reset and an empty, temporary inductor cache directory."""
    with _dynamo.fresh_inductor_cache():
        yield


def timed(fn: Callable[[], Any]) -> float:
    """Seconds one call of ``fn`` takes (CUDA synchronized when available)."""
    import torch

    sync = torch.cuda.synchronize if torch.cuda.is_available() else (lambda: None)
    sync()
    start = time.perf_counter()
    fn()
    sync()
    return time.perf_counter() - start


def interleaved_medians(
    variants: dict[str, Callable[[], Any]], *, rounds: int = 5, iters: int = 5
) -> dict[str, float]:
    """Median seconds per call of each variant, measured interleaved.

    Each round runs every variant ``iters`` times in turn, so load from other processes hits all
    variants alike; the result is the median over all rounds and iterations.
    """
    samples: dict[str, list[float]] = {name: [] for name in variants}
    for _ in range(rounds):
        for name, fn in variants.items():
            samples[name].extend(timed(fn) for _ in range(iters))
    return {name: statistics.median(values) for name, values in samples.items()}


def _cell(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.4g}"
    return "" if value is None else str(value)


def format_table(result: BenchResult) -> str:
    """The result as an aligned text table followed by its summary lines."""
    header = result.columns
    body = [[_cell(row.get(col)) for col in header] for row in result.rows]
    widths = [max(len(h), *(len(r[i]) for r in body)) for i, h in enumerate(header)]
    lines = [f"== {result.recipe}: {result.title}"]
    lines.append("  ".join(h.ljust(w) for h, w in zip(header, widths)))
    lines.append("  ".join("-" * w for w in widths))
    lines.extend("  ".join(c.ljust(w) for c, w in zip(r, widths)) for r in body)
    lines.extend(result.summary)
    return "\n".join(lines)


def write_json(path: str | os.PathLike[str], results: list[BenchResult]) -> Path:
    """Write the results and the environment to ``path`` (parents created)."""
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    payload = {"environment": environment(), "results": [asdict(r) for r in results]}
    out.write_text(json.dumps(payload, indent=2, default=str) + "\n")
    return out
