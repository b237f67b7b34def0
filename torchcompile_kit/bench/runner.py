"""Run one recipe in its own fresh process, so no recipe's warm caches flatter another.

``run_recipe_isolated`` starts ``python -m torchcompile_kit.bench.execute REQUEST.json`` with an
empty inductor (and Triton) cache dir and temp dir of its own under ``out_dir/_work/<recipe>`` (the
temp dir is where inductor keeps its precompiled C++ header, which a row must not inherit from
another, nor from earlier runs on the machine); warm-start
recipes load the artifact their cold recipe saved in ``out_dir/caches``. The child reports progress
as JSON lines on stdout and its result as JSON; its stderr goes to ``out_dir/logs/<recipe>.log``.
A recipe that raises, crashes or times out is a ``failed`` result, never an exception here.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .._child import start, stop, wait
from .._moved import refuses_moved
from .config import MeasureConfig
from .outcome import EVENT_PREFIX, RecipeResult, emit_event, set_event_sink

__all__ = [
    "EVENT_PREFIX",
    "INPROCESS_ENV",
    "RecipeResult",
    "RunRequest",
    "emit_event",
    "run_recipe_isolated",
]

INPROCESS_ENV = "TORCHCOMPILE_KIT_BENCH_INPROCESS"
"""Test switch: ``=1`` runs recipes in the calling process (no isolation, fresh dynamo state and
inductor cache only), which saves the 5-10 s start-up of a process per recipe in tests."""


@dataclass(frozen=True, kw_only=True)
class RunRequest:
    """What one recipe's run measures (the child process gets it as JSON; checked when built).

    Raises:
        ValueError: an unknown recipe, or a ``pair_with`` that is not a baseline recipe.
    """

    recipe: str
    """A name from :data:`torchcompile_kit.bench.recipes.RECIPES`."""
    spec: str | None = None
    """``None`` for the post's captioner, or a ``"module:function"`` model spec, loaded again in
    the child."""
    config: MeasureConfig = MeasureConfig()
    """Preset, backend, steps, warm-up steps and the steady seconds to time."""
    compile_overrides: dict[str, Any] = field(default_factory=dict)
    """JSON-able ``torch.compile`` kwargs merged over the recipe's own."""
    plan_steps: int | None = None
    """Also report ``plan_tokens_per_step`` for a run of this many steps; it also caps the steady
    steps."""
    check: str | None = None
    """``"module:function"`` called in the child on the recipe's compiled model after the
    measurement (``tune``'s gate; see :func:`~torchcompile_kit.bench.execute.execute_request`)."""
    pair_with: str | None = None
    """An eager baseline recipe whose eager copy steps beside the recipe's in alternating blocks
    (:mod:`torchcompile_kit.bench.paired`); ``None`` or the recipe itself: not paired."""

    def __post_init__(self) -> None:
        from .recipes import RECIPES, check_recipe_names

        check_recipe_names([self.recipe] + ([self.pair_with] if self.pair_with else []))
        if self.pair_with and RECIPES[self.pair_with].baseline != self.pair_with:
            raise ValueError(
                f"pair_with={self.pair_with!r} is not a baseline recipe (nothing compiled); "
                f"pass one of {sorted({r.baseline for r in RECIPES.values()})!r}, or None"
            )


@refuses_moved
def run_recipe_isolated(
    request: RunRequest,
    *,
    out_dir: str | os.PathLike[str],
    timeout_s: float | None = None,
    on_event: Callable[[dict[str, Any]], None] | None = None,
) -> RecipeResult:
    """Run a recipe in a fresh Python process with an empty inductor cache and return its result.

    Args:
        request: the recipe and how it is measured.
        out_dir: the run's directory (``caches/``, ``logs/`` and ``_work/`` go under it).
        timeout_s: kill the child after this many seconds (a ``failed`` result); ``None``: never.
        on_event: called with each progress event of the child.

    Returns:
        The :class:`RecipeResult`; never raises for a failure inside the recipe.

    Example:
        >>> r = run_recipe_isolated(RunRequest(recipe="eager", config=MeasureConfig(steps=2)),
        ...                         out_dir="/tmp/b")  # doctest: +SKIP
        >>> r.status, r.metrics.steps_per_s  # doctest: +SKIP
    """
    from .recipes import RECIPES

    recipe, config = request.recipe, request.config
    out = Path(out_dir)
    work = out / "_work" / recipe
    shutil.rmtree(work, ignore_errors=True)
    (work / "inductor").mkdir(parents=True)
    (work / "tmp").mkdir()
    (out / "logs").mkdir(parents=True, exist_ok=True)
    (out / "caches").mkdir(parents=True, exist_ok=True)
    data = {  # the child's request.json
        "recipe": recipe,
        "spec": request.spec,
        "preset": config.preset,
        "steps": config.steps_or_preset(),
        "warmup_steps": config.warmup_steps_or_preset(),
        "backend": config.backend_or_default(),
        "device": config.device_or_default(),
        "compile_overrides": dict(request.compile_overrides),
        "plan_steps": request.plan_steps,
        "steady_s": config.steady_s,
        "pin": config.pinned_cpus(),
        "check": request.check,
        "pair_with": request.pair_with,
        "cache_dir": str((out / "caches").resolve()),
        "result_path": str((work / "result.json").resolve()),
    }
    (work / "request.json").write_text(json.dumps(data, indent=2))
    ranks = RECIPES[recipe].world_size
    started = time.perf_counter()
    if os.environ.get(INPROCESS_ENV) == "1":
        result = _run_in_process(data, ranks, on_event)
    else:
        result = _run_children(
            data, work, out / "logs" / f"{recipe}.log", ranks, timeout_s, on_event
        )
    result.wall_s = time.perf_counter() - started
    shutil.rmtree(work / "tmp", ignore_errors=True)
    if result.status != "skipped":
        shutil.rmtree(work / "inductor", ignore_errors=True)  # kernels are big; the log stays
    return result


def _child_env(work: Path, rank: int, world_size: int, port: int) -> dict[str, str]:
    env = dict(os.environ)
    env["TORCHINDUCTOR_CACHE_DIR"] = str((work / "inductor").resolve())
    env["TRITON_CACHE_DIR"] = str((work / "inductor" / "triton").resolve())
    env["TMPDIR"] = str((work / "tmp").resolve())
    # the user's modules (--model) import in the child as they did here
    env["PYTHONPATH"] = os.pathsep.join([os.getcwd(), *filter(None, [env.get("PYTHONPATH")])])
    env["PYTHONUNBUFFERED"] = "1"
    if world_size > 1:
        threads = max(1, (os.cpu_count() or 2) // world_size)
        env.update(
            RANK=str(rank),
            LOCAL_RANK=str(rank),
            WORLD_SIZE=str(world_size),
            MASTER_ADDR="127.0.0.1",
            MASTER_PORT=str(port),
            OMP_NUM_THREADS=str(threads),
        )
    return env


def _free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _run_children(
    request: dict[str, Any],
    work: Path,
    log_path: Path,
    world_size: int,
    timeout_s: float | None,
    on_event: Callable[[dict[str, Any]], None] | None,
) -> RecipeResult:
    port = _free_port() if world_size > 1 else 0
    command = [sys.executable, "-m", "torchcompile_kit.bench.execute", str(work / "request.json")]
    paths = [
        log_path if r == 0 else log_path.with_suffix(f".rank{r}.log") for r in range(world_size)
    ]
    # one log per rank, open while its process runs and closed below once every process ended
    logs = [open(path, "w") for path in paths]  # noqa: SIM115
    procs = [
        start(command, env=_child_env(work, r, world_size, port), log=logs[r], pipe=r == 0)
        for r in range(world_size)
    ]
    began = time.monotonic()

    def forward(line: str) -> None:  # rank 0's progress events
        if line.startswith(EVENT_PREFIX) and on_event is not None:
            try:
                on_event(json.loads(line[len(EVENT_PREFIX) :]))
            except ValueError:
                pass

    end = wait(procs[0], timeout_s=timeout_s, log=log_path, on_line=forward)
    for proc, path in zip(procs[1:], paths[1:]):
        if end.hung_s is not None:
            stop(proc)
            continue
        left = None if timeout_s is None else max(1.0, timeout_s - (time.monotonic() - began))
        wait(proc, timeout_s=left, log=path)
    for log in logs:
        log.close()
    result = Path(request["result_path"])
    if end.hung_s is None and result.is_file():
        return RecipeResult.from_dict(json.loads(result.read_text()))
    return RecipeResult(
        name=request["recipe"],
        status="failed",
        error=f"{end.describe()}; no result (log: {log_path})",
        stopped_after_s=end.hung_s,
    )


def _run_in_process(
    request: dict[str, Any], world_size: int, on_event: Callable[[dict[str, Any]], None] | None
) -> RecipeResult:
    if world_size > 1:
        return RecipeResult(
            name=request["recipe"],
            status="skipped",
            reason=f"{INPROCESS_ENV}=1 runs recipes in this process; {world_size} "
            "ranks need processes",
        )
    from .. import _dynamo
    from .execute import execute_request

    set_event_sink(on_event or (lambda event: None))
    try:
        with _dynamo.fresh_inductor_cache():
            return execute_request(request)
    finally:
        set_event_sink(None)
