"""``results.json``: what a bench run writes, and how ``report`` reads it back.

Schema ``torchcompile-kit/bench-results/1``::

    {
      "schema": "torchcompile-kit/bench-results/1",
      "environment": {date, git_commit, python, platform, cpu_count, torch_threads, device,
                      torch, transformers, peft, accelerate},
      "settings": {preset, steps, warmup_steps, backend, model, recipes, command},
      "started": ISO time, "finished": ISO time,
      "rows": [ {name, group, description, status, metrics, error, reason, wall_s, settings}, ... ]
    }

``metrics`` of an ``ok`` row hold every measurement of :mod:`.metrics` (losses and step times
included) plus the comparisons (``speedup``, ``warmup_ratio``, ``loss_max_abs_diff``); a failed
row keeps its error, a skipped row its reason.
"""

from __future__ import annotations

import datetime
import json
import os
import platform
import subprocess
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from .._compat import package_version
from .metrics import compare
from .recipes import RECIPES
from .runner import RecipeResult

__all__ = ["RESULTS_FILE", "SCHEMA", "ResultsFileError", "build_results", "load_results", "write_results"]

SCHEMA = "torchcompile-kit/bench-results/1"
RESULTS_FILE = "results.json"


class ResultsFileError(ValueError):
    """A results file is missing, is not JSON, or is not a bench results file."""


def now() -> str:
    """The current UTC time, ISO 8601, to the second."""
    return datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")


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
        "date": now(),
        "git_commit": commit or None,
        "python": platform.python_version(),
        "platform": platform.platform(),
        "cpu_count": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "device": device,
        "torch": torch.__version__,
        **{name: str(package_version(name)) for name in ("transformers", "peft", "accelerate")},
    }


def build_results(
    results: list[RecipeResult], *, settings: Mapping[str, Any], started: str,
    complete: bool = True,
) -> dict[str, Any]:
    """The results document of a run: environment, settings and one row per recipe.

    Args:
        results: the recipes' results, in run order.
        settings: what the run was asked for (preset, steps, backend, model, recipes, command).
        started: when the run started (:func:`now`).
        complete: every recipe of ``settings["recipes"]`` has run. ``bench`` writes the document
            after each row with ``False`` (``report`` renders it, saying what is missing).

    Returns:
        The document (JSON-ready), with the cross-recipe comparisons filled in.
    """
    rows = []
    for result in results:
        row = result.to_dict()
        recipe = RECIPES.get(result.name)
        row["description"] = recipe.description if recipe else ""
        rows.append(row)
    compare(rows, RECIPES)
    return {
        "schema": SCHEMA,
        "environment": environment(),
        "settings": dict(settings),
        "started": started,
        "finished": now(),
        "complete": complete,
        "rows": rows,
    }


def write_results(out_dir: str | os.PathLike[str], document: Mapping[str, Any]) -> Path:
    """Write ``document`` to ``out_dir/results.json`` atomically and return the path.

    The file is replaced whole (written beside it, then renamed), so a run interrupted while
    writing leaves the previous version, never half a file.
    """
    path = Path(out_dir) / RESULTS_FILE
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(path.name + ".tmp")
    partial.write_text(json.dumps(document, indent=2, default=str) + "\n")
    os.replace(partial, path)
    return path


def load_results(path: str | os.PathLike[str]) -> dict[str, Any]:
    """Read a results document from a run directory or a ``results.json`` path, and check it.

    Args:
        path: the ``--out`` directory of a run, or the JSON file itself.

    Returns:
        The document.

    Raises:
        ResultsFileError: no such file, not JSON, or not a bench results document.

    Example:
        >>> doc = load_results("bench-results")  # doctest: +SKIP
    """
    file = Path(path)
    if file.is_dir():
        file = file / RESULTS_FILE
    if not file.is_file():
        raise ResultsFileError(
            f"no results at {str(file)!r}; pass the --out directory of a bench run or its "
            f"{RESULTS_FILE}"
        )
    try:
        data = json.loads(file.read_text())
    except ValueError as err:
        raise ResultsFileError(f"{str(file)!r} is not JSON: {err}") from err
    if not isinstance(data, dict) or data.get("schema") != SCHEMA or not isinstance(data.get("rows"), list):
        raise ResultsFileError(
            f"{str(file)!r} is not a torchcompile-kit bench results file (expected schema "
            f"{SCHEMA!r}, got {data.get('schema') if isinstance(data, dict) else type(data).__name__!r})"
        )
    for index, row in enumerate(data["rows"]):
        if not isinstance(row, dict) or not {"name", "status", "metrics"} <= set(row):
            raise ResultsFileError(f"{str(file)!r}: rows[{index}] lacks name/status/metrics")
    return data
