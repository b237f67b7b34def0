"""``results.json`` (schema ``torchcompile-kit/bench-results/1``): what a bench run writes
(:class:`BenchResults`: environment, settings, one row per recipe), and how ``report`` reads it.
"""

from __future__ import annotations

import datetime
import json
import os
import platform
import subprocess
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .._compat import package_version
from ..errors import TorchCompileKitError
from .metrics import compare
from .recipes import RECIPES
from .runner import RecipeResult

__all__ = [
    "RESULTS_FILE",
    "SCHEMA",
    "BenchResults",
    "ResultsFileError",
    "build_results",
    "load_results",
    "write_results",
]

SCHEMA = "torchcompile-kit/bench-results/1"
RESULTS_FILE = "results.json"


class ResultsFileError(TorchCompileKitError, ValueError):
    """A results file is missing, is not JSON, or is not a bench results file."""


@dataclass(kw_only=True, slots=True)
class BenchResults:
    """A bench run: where and how it ran, and its rows. Round-trips through JSON."""

    rows: list[RecipeResult]
    """One result per recipe, in run order."""
    environment: dict[str, Any] = field(default_factory=dict)
    """Date, git commit, Python, platform, CPU count, torch threads, device, package versions."""
    settings: dict[str, Any] = field(default_factory=dict)
    """What the run was asked for: preset, steps, warm-up steps, backend, model, recipes, command.
    """
    started: str = ""
    """When it started (ISO 8601, UTC)."""
    finished: str = ""
    """When this document was written."""
    complete: bool = True
    """Every recipe of ``settings["recipes"]`` has run (``bench`` rewrites the file after each row).
    """
    schema: str = SCHEMA
    """The file format."""

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready data (the file's content)."""
        return {
            "schema": self.schema,
            "environment": self.environment,
            "settings": self.settings,
            "started": self.started,
            "finished": self.finished,
            "complete": self.complete,
            "rows": [row.as_dict() for row in self.rows],
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> BenchResults:
        """Rebuild from :meth:`as_dict` data."""
        return cls(
            rows=[RecipeResult.from_dict(row) for row in data["rows"]],
            environment=dict(data.get("environment") or {}),
            settings=dict(data.get("settings") or {}),
            started=data.get("started", ""),
            finished=data.get("finished", ""),
            complete=data.get("complete", True),
            schema=data.get("schema", SCHEMA),
        )


def now() -> str:
    """The current UTC time, ISO 8601, to the second."""
    return datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")


def environment() -> dict[str, Any]:
    """Versions, machine and commit, recorded with every result; on a GPU its name, capability,
    SM count, count, CUDA, driver and Triton (rows from different GPUs are not comparable)."""
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
    from ..cache import current_environment

    cache = current_environment()  # the GPU's identity as the compile cache records it
    device = cache["gpu"]["name"] if cache["gpu"] else "cpu"
    return {
        "date": now(),
        "git_commit": commit or None,
        "python": platform.python_version(),
        "platform": platform.platform(),
        "cpu_count": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "device": device,
        "torch": torch.__version__,
        "gpu": cache["gpu"],
        "gpu_count": torch.cuda.device_count() if cache["gpu"] else 0,
        **{name: cache[name] for name in ("cuda", "hip", "driver", "triton", "cpu_isa")},
        **{name: str(package_version(name)) for name in ("transformers", "peft", "accelerate")},
    }


def build_results(
    results: list[RecipeResult], *, settings: Mapping[str, Any], started: str, complete: bool = True
) -> BenchResults:
    """The results document of a run, the cross-recipe comparisons filled in (on copies of
    ``results``); ``complete=False`` while rows are still to come (``report`` says what is
    missing)."""
    rows = [RecipeResult.from_dict(result.as_dict()) for result in results]
    for row in rows:
        recipe = RECIPES.get(row.name)
        row.description = recipe.description if recipe else ""
    compare(rows, RECIPES)
    return BenchResults(
        rows=rows,
        environment=environment(),
        settings=dict(settings),
        started=started,
        finished=now(),
        complete=complete,
    )


def write_results(out_dir: str | os.PathLike[str], document: BenchResults) -> Path:
    """Write ``document`` to ``out_dir/results.json`` atomically and return the path.

    The file is replaced whole (written beside it, then renamed), so a run interrupted while
    writing leaves the previous version, never half a file.
    """
    path = Path(out_dir) / RESULTS_FILE
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(path.name + ".tmp")
    partial.write_text(json.dumps(document.as_dict(), indent=2, default=str) + "\n")
    os.replace(partial, path)
    return path


def load_results(path: str | os.PathLike[str]) -> BenchResults:
    """Read and check the results of a run directory or ``results.json`` path; ``ResultsFileError``
    when there is no such file or it is not a bench results document."""
    file = Path(path)
    if file.is_dir():
        file = file / RESULTS_FILE
    if not file.is_file():
        raise ResultsFileError(
            f"no results at {str(file)!r}; pass the --out directory of a bench "
            f"run or its {RESULTS_FILE}"
        )
    try:
        data = json.loads(file.read_text())
    except ValueError as err:
        raise ResultsFileError(f"{str(file)!r} is not JSON: {err}") from err
    if (
        not isinstance(data, dict)
        or data.get("schema") != SCHEMA
        or not isinstance(data.get("rows"), list)
    ):
        raise ResultsFileError(
            f"{str(file)!r} is not a torchcompile-kit bench results file (expected schema "
            f"{SCHEMA!r}, got "
            f"{data.get('schema') if isinstance(data, dict) else type(data).__name__!r})"
        )
    for index, row in enumerate(data["rows"]):
        if not isinstance(row, dict) or not {"name", "status", "metrics"} <= set(row):
            raise ResultsFileError(f"{str(file)!r}: rows[{index}] lacks name/status/metrics")
    return BenchResults.from_dict(data)
