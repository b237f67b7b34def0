"""Train while it compiles: :func:`compile_in_background`, a layer above ``compile_regional`` and
``compile_model``. Experimental: it rests on precompiled regions (dynamo's private precompile API,
``_dynamo/precompile.py``), and can leave that label when torch's precompile API is public.

The model trains eagerly from its first call. That call's batch, the model's recipe (its class and
config, or a factory) and the state the graphs depend on go to a worker process, started
``start_after_s`` of training later, which rebuilds the model, compiles the same regions on that
batch with ``precompile=True`` and saves a compile cache.
At the first call after the worker is done (under ``torch.distributed``, of the first call's
kind: a training step when training came first), the model loads that cache and compiles in
place: a warm start, each region's entry checked against the model's own fingerprint first (a
mismatch keeps training eager, never a stale graph). docs/cache.md ("Train while it compiles").
"""

from __future__ import annotations

import atexit
import enum
import inspect
import io
import json
import logging
import os
import shutil
import sys
import tempfile
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn

from .._checks import check_compile_kwargs
from .._child import poll, start, stop
from .._factory import check_factory
from .._moved import refuses_moved
from .._undo import register_undo
from ..cache import Keys, load_with_keys, read_signed, resolve_keys, write_signed
from ..diagnostics import note_running_monitors
from ..errors import CompileCacheWarning
from .compile import (
    already_compiled,
    check_model,
    compile_model,
    compile_regional,
    install_first_call_check,
    uncompile,
)
from .cuda_graphs import model_device
from .plan import PENDING_ATTR
from .precompiled import precompile_refusal, regions_created

__all__ = [
    "RECIPES",
    "BackgroundCompile",
    "BackgroundState",
    "compile_in_background",
    "get_background_compile",
]

logger = logging.getLogger(__name__)

_ATTR = "_torchcompile_kit_background"
_RUNNING: list[BackgroundCompile] = []  # the workers to stop at exit

RECIPES: dict[str, Callable[..., nn.Module]] = {
    f.__name__: f for f in (compile_regional, compile_model)
}
"""The compile functions a background compile runs, by name (the worker imports them by it)."""


class BackgroundState(enum.Enum):
    """Where a background compile is."""

    WAITING = "waiting for the first call"
    COMPILING = "compiling"
    SWITCHING = "switching"
    COMPILED = "compiled"
    """Switched: the model runs the worker's compiled code."""
    EAGER = "eager"
    """Given up or cancelled: training stays eager (``eager_reason`` says why)."""


@dataclass(kw_only=True)
class BackgroundCompile:
    """Options of a background compile, and what it did (``get_background_compile(model)``).

    Pass ``worker=BackgroundCompile(...)`` to :func:`compile_in_background`.
    """

    factory: str | None = None
    """``"module:function"`` (or ``"file.py:function"``) returning the model, or a tuple whose first
    item is it (the ``--model`` contract of ``bench``); ``None`` rebuilds a transformers model from
    its class and config."""
    cpus: list[int] | None = None
    """The CPUs the worker may run on (``os.sched_setaffinity``), e.g. the cores training does not
    use; ``None``: all (it compiles for training's thread count either way: CPU kernels are built
    for one)."""
    nice: int = 19
    """The worker's niceness (0–19), its compilers' too. It does not protect training on CPU: a
    model on the CPU whose threads use every core it may run on still slows down many times while
    the worker compiles beside it (measured, docs/cache.md); give the worker ``cpus`` of its own."""
    start_after_s: float = 1.0
    """Seconds of training after the first call (whose batch the worker compiles) before the worker
    starts. A process that starts and imports torch slows the steps beside it for a moment, even
    on a CPU of its own (measured on this project's 2-vCPU VM: ~20 ms on a 0.1 s CPU step): paid
    in the first step, that is a 15-20% slower start than eager; a second into training, ~2%. It
    delays the switch by as much."""
    timeout_s: float = 3600.0
    """A worker still running this long after it started is stopped and training stays eager."""
    directory: str | None = None
    """Where the worker's batch and artifact go (a temporary folder by default, removed after the
    switch and at exit). Under ``torch.distributed`` every rank reads it: a shared filesystem
    across machines."""
    state: BackgroundState = BackgroundState.WAITING
    """Where it is: :class:`BackgroundState`."""
    eager_reason: str | None = None
    """Why training stays eager (``state`` is ``EAGER``)."""
    eager_steps: int = 0
    """Grad-enabled training calls that ran eagerly (the first one included)."""
    switched_at_call: int | None = None
    """The model call at which it switched to compiled code (1-based), if it did."""
    stall_s: float | None = None
    """Seconds from the switch to the end of the first compiled call: the cache load, the compile
    call, and that call (the entries installed, the first-call check, the call's own compute)."""
    worker_check: str | None = None
    """The worker's first-call check of its compiled call on the first batch, against eager:
    ``"passed"`` (outputs and gradients matched: the training process then compares only the
    outputs of its first compiled call, the same graphs on its own weights), ``"partial"``,
    ``"skipped"`` (then the training process checks in full); a failed check fails the worker."""
    worker_s: float | None = None
    """Seconds from starting the worker to seeing it done."""
    handoff_s: float | None = None
    """Seconds the first call spent handing its batch and state to the worker."""
    device: str | None = None
    """Where the worker compiles: the training model's device at its first call (``"cuda:0"``:
    the training GPU, beside training; ``"cpu"``)."""
    gpu_memory: str | None = None
    """On a GPU, the free-memory check before the worker started: the free MiB and what the
    worker may need (an estimate, see docs/cache.md); ``None`` on CPU."""
    _first_call_bytes: int = field(default=0, init=False, repr=False)
    _calls: int = field(default=0, init=False, repr=False)
    _handle: Any = field(default=None, init=False, repr=False)
    _proc: Any = field(default=None, init=False, repr=False)
    _job: Path | None = field(default=None, init=False, repr=False)
    _owned_dir: bool = field(default=False, init=False, repr=False)
    _started: float = field(default=0.0, init=False, repr=False)
    _handed_at: float = field(default=0.0, init=False, repr=False)  # rank 0's job written
    _switch_started: float | None = field(default=None, init=False, repr=False)
    _hook: Any = field(
        default=None, init=False, repr=False
    )  # the after-call hook (re-added at the switch)
    _grads_checked: dict[Any, str] = field(default_factory=dict, init=False, repr=False)
    # the first call's (training, grad mode): under torch.distributed, the calls that ask the
    # worker's status and switch
    _mode: tuple[bool, bool] | None = field(default=None, init=False, repr=False)

    def summary(self) -> str:
        """One line for a training log."""
        if self.switched_at_call is not None and self.stall_s is None:
            return f"background compile: compiled from call {self.switched_at_call} (not run yet)"
        if self.switched_at_call is not None:
            return (
                f"background compile: compiled from call {self.switched_at_call} after "
                f"{self.eager_steps} eager steps (worker {self.worker_s:.1f} s, stall at the "
                f"switch {self.stall_s:.2f} s)"
            )
        state = self.state.value + (f": {self.eager_reason}" if self.eager_reason else "")
        return f"background compile: {state} ({self.eager_steps} eager steps so far)"


def get_background_compile(model: nn.Module) -> BackgroundCompile | None:
    """The :class:`BackgroundCompile` of ``model``, or ``None`` when it has none.

    Example:
        >>> get_background_compile(model).summary()  # doctest: +SKIP
        'background compile: compiled from call 412 after 411 eager steps (worker 17.3 s, ...)'
    """
    return model.__dict__.get(_ATTR)


@refuses_moved
def compile_in_background(
    model: nn.Module,
    compile_fn: Callable[..., nn.Module] = compile_regional,
    *,
    worker: BackgroundCompile | None = None,
    **compile_kwargs: Any,
) -> nn.Module:
    """Train ``model`` eagerly at once while a worker process compiles it, and switch to compiled
    code at the first call after the worker is done. Experimental (see the module's docstring).

    The worker rebuilds the model (a transformers model from its class and config, or
    ``worker.factory``), runs ``compile_fn(model, precompile=True, verify=True,
    **compile_kwargs)`` on the first call's batch and saves a compile cache. At the switch this
    process loads it and calls ``compile_fn`` itself: a warm start whose first call is checked
    against eager. A worker that fails, runs past ``worker.timeout_s`` or compiled for another
    model state leaves training eager, with the reason (warned, and in the record).

    Args:
        model: the model; trains eagerly until the switch, then is compiled in place.
        compile_fn: :func:`compile_regional` (default) or :func:`compile_model`.
        worker: :class:`BackgroundCompile`: the worker's factory, CPUs, niceness, start delay,
            timeout and folder; ``None``: the defaults.
        **compile_kwargs: ``compile_fn``'s options (``blocks``, ``backend``, ``fullgraph``, ...),
            as JSON (names, not objects); inductor only. ``precompile`` and ``verify`` are implied.

    Returns:
        ``model`` itself; its record is :func:`get_background_compile`.

    Raises:
        TypeError: ``compile_fn`` is not ``compile_regional`` or ``compile_model``, or
            ``worker`` is not a ``BackgroundCompile``.
        ValueError: the options cannot reach the worker (not JSON, another backend, a
            CUDA-graph mode, ``precompile``/``verify`` given), the model has no config and no
            factory was given, or the factory's module or file cannot be found.

    Example:
        >>> model = compile_in_background(GPT2LMHeadModel(config))  # doctest: +SKIP
        >>> model = compile_in_background(
        ...     model, compile_model, worker=BackgroundCompile(factory="mypkg.models:build")
        ... )  # doctest: +SKIP
    """
    check_model(model)
    if compile_fn not in RECIPES.values():
        raise TypeError(
            f"compile_in_background: compile_fn={compile_fn!r:.80} must be compile_regional or "
            "compile_model (the worker runs the same function)"
        )
    options = BackgroundCompile() if worker is None else worker
    if not isinstance(options, BackgroundCompile):
        raise TypeError(
            f"compile_in_background: worker={worker!r:.80} must be BackgroundCompile(...) or "
            f"None; got {type(worker).__name__}"
        )
    _check_options(model, options, compile_fn, compile_kwargs)
    if already_compiled(model):
        return model
    model.__dict__[_ATTR] = options
    model.__dict__[PENDING_ATTR] = options
    register_undo(model, lambda: _cancel(model, options))
    spec = {
        "recipe": compile_fn.__name__,
        "compile_kwargs": compile_kwargs,
        "model": _model_source(model, options),
    }
    _prepare(model, options, spec)
    # after each call, not before: a switch then compiles between two calls, and the next one
    # runs with every hook the compile installs (a pre-hook added during a call does not run)
    options._hook = lambda module, args, kwargs, output: _after_call(
        module, args, kwargs, options, compile_fn, compile_kwargs
    )
    options._handle = model.register_forward_hook(options._hook, with_kwargs=True)
    return model


def _check_options(
    model: nn.Module,
    options: BackgroundCompile,
    compile_fn: Callable[..., nn.Module],
    compile_kwargs: dict[str, Any],
) -> None:
    """What the worker could not reproduce, refused at the call (not at the switch after minutes
    of compiling)."""
    implied = sorted({"precompile", "verify"} & set(compile_kwargs))
    if implied:
        raise ValueError(
            f"compile_in_background: {', '.join(implied)} is implied (the worker precompiles and "
            "the switch checks the first call against eager); drop it"
        )
    # a misspelt keyword is refused now, not in the worker minutes later
    check_compile_kwargs(
        compile_kwargs,
        caller=compile_fn.__name__,
        takes=inspect.signature(compile_fn).parameters,
    )
    if options.factory is not None:
        check_factory(options.factory, flag="factory=")
    if not options.start_after_s >= 0:
        raise ValueError(
            f"BackgroundCompile(start_after_s={options.start_after_s!r}): seconds of "
            "training before the worker starts, 0 or more (0: at the end of the first call)"
        )
    if options.factory is None and getattr(model, "config", None) is None:
        raise ValueError(
            f"background compile of {type(model).__name__}: the worker rebuilds a "
            "transformers model from its class and config, and this model has no "
            "config; pass a factory that builds it: "
            "worker=BackgroundCompile(factory='mypkg.models:build') (returns the model)"
        )
    try:
        json.dumps(compile_kwargs)
    except TypeError as err:
        raise ValueError(
            "background compile: the worker gets the compile options as JSON, and "
            f"{compile_kwargs!r} is not ({err}); pass names (backend='inductor') "
            "rather than objects"
        ) from err
    if compile_kwargs.get("backend", "inductor") != "inductor":
        raise ValueError(
            "background compile needs backend='inductor' (what the worker compiles "
            "reaches the training process as inductor's cache); got "
            f"{compile_kwargs['backend']!r}"
        )
    blocks = compile_kwargs.get("blocks")
    for options_of in [compile_kwargs, *(blocks.values() if isinstance(blocks, dict) else ())]:
        refusal = precompile_refusal(options_of, None)
        if refusal is not None:
            raise ValueError(
                f"background compile: the worker precompiles what it compiles "
                f"(precompile=True), and {refusal}; drop it for the background "
                "compile, or compile in the foreground with it"
            )


# --- the training side ------------------------------------------------------------------------


def _after_call(
    model: nn.Module,
    args: tuple,
    kwargs: dict,
    options: BackgroundCompile,
    compile_fn: Callable[..., nn.Module],
    compile_kwargs: dict[str, Any],
) -> None:
    if torch.compiler.is_compiling():
        return
    options._calls += 1
    if options._switch_started is not None:  # the first compiled call has run
        options.stall_s = time.perf_counter() - options._switch_started
        options._switch_started = None
        options._handle.remove()  # type: ignore[attr-defined]
        logger.info(options.summary())
        note_running_monitors(options.summary())
        return
    if options.state not in (BackgroundState.WAITING, BackgroundState.COMPILING):
        return
    mode = (model.training, torch.is_grad_enabled())
    if mode == (True, True):
        options.eager_steps += 1
    if options.state is BackgroundState.WAITING:
        options._mode = mode
        _send_batch(model, args, kwargs, options)
    elif mode != options._mode and _rank() is not None:
        # every rank makes calls of the first one's kind (training steps); another kind (an
        # evaluation on rank 0 alone) must not enter the status exchange below
        return
    refused = None  # rank 0 alone decides to start the worker; every rank learns the outcome
    if (
        options._proc is None
        and options._handed_at
        and time.perf_counter() - options._handed_at >= options.start_after_s
    ):
        refused = _gpu_memory_short(options)
        if refused is None:
            _start_worker(model, options)
    status = _worker_status(options, refused)
    if status == "done":
        _switch(model, options, compile_fn, compile_kwargs)
    elif status != "running":
        _give_up(model, options, status)


def _keys() -> Keys:
    """The keys the hand-off files are signed and checked with: ``$TORCHCOMPILE_KIT_CACHE_KEY``'s,
    which the worker inherits (none: unsigned, as the worker's private folder always was)."""
    return resolve_keys(None, caller="background compile")


def _prepare(model: nn.Module, options: BackgroundCompile, spec: dict[str, Any]) -> None:
    """At the compile call: the worker's folder and what it builds (rank 0 only)."""
    if _rank(at_start=True) not in (None, 0):
        return
    _warn_if_sharing_cores(model, options)
    if options.directory:
        folder = Path(options.directory)
        folder.mkdir(parents=True, exist_ok=True)
    else:
        folder = Path(tempfile.mkdtemp(prefix="tck-background-"))
        options._owned_dir = True
    options._job = folder / "job.json"
    # the worker compiles for training's thread count (CPU kernels are built for it, and a cache
    # saved for another count is refused), whatever CPUs it runs on
    threads = torch.get_num_threads()
    write_signed(
        folder / "model.json",
        json.dumps({**spec, "cwd": os.getcwd(), "threads": threads}).encode(),
        _keys(),
    )
    if not _RUNNING:
        atexit.register(_stop_all)
    _RUNNING.append(options)  # its folder goes at exit even if no worker started


def _start_worker(model: nn.Module, options: BackgroundCompile) -> None:
    """``start_after_s`` after the first call (rank 0): the worker, with its job in its folder."""
    folder = options._job.parent
    threads = json.loads(read_signed(folder / "model.json", _keys()))["threads"]
    env = {
        **os.environ,
        "TORCHINDUCTOR_CACHE_DIR": str(folder / "inductor"),
        "OMP_NUM_THREADS": str(threads),
    }
    command = [
        sys.executable,
        "-m",
        "torchcompile_kit.regional.background_worker",
        str(folder),
        str(os.getpid()),  # the worker stops when this process is gone
    ]
    with open(folder / "worker.log", "wb") as log:  # its own session: stop() ends its workers too
        options._proc = start(command, env=env, log=log, own_session=True)
    # at once, not in the worker: its imports would run at training's priority and CPUs
    os.setpriority(os.PRIO_PROCESS, options._proc.pid, options.nice)
    if options.cpus:
        os.sched_setaffinity(options._proc.pid, options.cpus)
    options._started = time.perf_counter()
    logger.info(
        "background compile: worker %d started for %s", options._proc.pid, type(model).__name__
    )


CUDA_CONTEXT_BYTES = 512 * 2**20
"""A CUDA context's memory on the device (about 0.5 GiB with torch's kernels loaded)."""


def _gpu_memory_short(options: BackgroundCompile) -> str | None:
    """Before the worker starts on the training GPU: why it must not (it may not fit beside
    training, whose out-of-memory would be a crash, not a slower start), or ``None``.

    The worker may need a CUDA context, a copy of the model, and one step of the first batch run
    eagerly and compiled with its gradients kept for the check: estimated as the context and twice
    what the training process held at the end of its first forward (the model and that call's
    activations). An estimate, not a measurement: docs/cache.md says what was measured."""
    if options.device is None or not options.device.startswith("cuda"):
        return None
    device = torch.device(options.device)
    free, total = torch.cuda.mem_get_info(device)
    need = CUDA_CONTEXT_BYTES + 2 * options._first_call_bytes
    mib = 2**20
    options.gpu_memory = (
        f"{free / mib:.0f} MiB free of {total / mib:.0f} MiB on {options.device}; "
        f"the worker may need about {need / mib:.0f} MiB"
    )
    if free >= need:
        return None
    return (
        f"the worker would compile on the training GPU ({options.gpu_memory}), where running "
        "out of memory would crash training; the worker was not started. Compile in the "
        "foreground (compile_regional or compile_model), or free memory on the GPU before the "
        "first call"
    )


def _warn_if_sharing_cores(model: nn.Module, options: BackgroundCompile) -> None:
    """A CPU model whose torch threads leave no core of their own to the worker: say what that
    costs."""
    on_cpu = model_device(model).type == "cpu"
    cores = os.sched_getaffinity(0) | set(options.cpus or ())
    if on_cpu and torch.get_num_threads() >= len(cores):
        warnings.warn(
            f"background compile: training's {torch.get_num_threads()} torch threads "
            f"leave none of the CPUs {sorted(cores)} to the worker; while it compiles, "
            "eager steps may run many times slower (measured: up to 48x on 2 cores, "
            "docs/cache.md). Give it CPUs of its own: BackgroundCompile(cpus=[...]) "
            "with fewer training threads (torch.set_num_threads) on the other cores.",
            UserWarning,
            stacklevel=5,
        )


def _send_batch(model: nn.Module, args: tuple, kwargs: dict, options: BackgroundCompile) -> None:
    """At the end of the first call: its batch and the state the graphs depend on, for the
    worker (rank 0; every rank learns the folder)."""
    starts_the_worker = options._job is not None  # set up at the compile call: rank 0
    if _rank() is not None:
        shared = [str(options._job) if options._job else None]
        torch.distributed.broadcast_object_list(shared, src=0)
        options._job = Path(shared[0])
        options._started = options._started or time.perf_counter()
    options.state = BackgroundState.COMPILING
    if not starts_the_worker:
        return
    began = time.perf_counter()
    folder = options._job.parent
    batch = io.BytesIO()
    torch.save({"args": args, "kwargs": kwargs}, batch)
    write_signed(folder / "batch.pt", batch.getvalue(), _keys())
    autocast = next(
        (
            {"device_type": d, "dtype": str(torch.get_autocast_dtype(d))}
            for d in ("cuda", "cpu")
            if torch.is_autocast_enabled(d)
        ),
        None,
    )
    device = model_device(model)
    options.device = str(device)
    if device.type == "cuda":  # the model, and this call's activations kept for its backward
        options._first_call_bytes = torch.cuda.memory_allocated(device)
    job = {
        "parameters": {n: [str(p.dtype), p.requires_grad] for n, p in model.named_parameters()},
        "training": model.training,
        "grad": torch.is_grad_enabled(),
        "autocast": autocast,
        "device": str(device),
    }
    write_signed(folder / "job.tmp", json.dumps(job).encode(), _keys())
    os.replace(folder / "job.tmp", options._job)
    options._handed_at = time.perf_counter()
    options.handoff_s = options._handed_at - began


def _worker_status(options: BackgroundCompile, refused: str | None) -> str:
    """``"running"``, ``"done"``, or why it failed or was not started (``refused``); the same
    answer on every rank (rank 0's)."""
    status = refused or "running"
    if refused is None and options._proc is not None:
        log = options._job.parent / "worker.log" if options._job is not None else None
        end = poll(options._proc, started=options._started, timeout_s=options.timeout_s, log=log)
        if end is not None and end.ok:
            status = "done"
        elif end is not None:
            past = f" (timeout_s={options.timeout_s:g})" if end.hung_s is not None else ""
            status = f"the worker failed: {end.describe()}{past}"
    if _rank() is not None:  # every rank switches (or gives up) at the same call
        shared = [status]
        torch.distributed.broadcast_object_list(shared, src=0)
        status = shared[0]
    return status


def _switch(
    model: nn.Module,
    options: BackgroundCompile,
    compile_fn: Callable[..., nn.Module],
    compile_kwargs: dict[str, Any],
) -> None:
    """Load the worker's cache and compile in place, if every region it will create is in it."""
    started = time.perf_counter()
    options.worker_s = started - options._started
    options.state = BackgroundState.SWITCHING
    # every rank reads the worker's one artifact (compiled on rank 0's device: on other GPUs
    # dynamo's device guards trace those ranks again at the switch, docs/cache.md)
    loaded = load_with_keys(options._job.with_name("compile-cache.tck"), _keys(), per_rank=False)
    why = None if loaded else f"its cache did not load ({loaded.reason})"
    try:
        result = json.loads(read_signed(options._job.with_name("result.json"), _keys()))
    except (OSError, ValueError) as err:  # SignatureRefused is a ValueError
        result, why = (
            {"regions": {}, "check": {}},
            why or f"its result.json could not be read ({err})",
        )
    keys, check = set(result["regions"].values()), result["check"]
    options.worker_check = check.get("status")
    if check.get("gradients_passed_in") is not None:  # [training, grad]: the verifier's state key
        options._grads_checked = {
            tuple(check["gradients_passed_in"]): "the background worker's, same batch"
        }
    if _rank() is not None:  # rank 0 removes the worker's folder next: every rank has read it
        torch.distributed.barrier()
    if why is not None:
        _give_up(model, options, why)
        return
    model.__dict__.pop(PENDING_ATTR, None)
    with regions_created() as regions:
        compile_fn(model, precompile=True, **compile_kwargs)
    missing = sorted({r.label for r in regions if r.key not in keys})
    if missing or not regions:
        uncompile(model)
        why = (
            "nothing was precompiled"
            if not regions
            else f"it compiled {', '.join(missing)} for another model state (the fingerprint "
            "differs: parameters, config, classes or compile options)"
        )
        _give_up(model, options, why)
        return
    options.state = BackgroundState.COMPILED
    # the first call compared with eager; its gradients only where the worker did not compare them
    install_first_call_check(model, compile_fn.__name__, compile_kwargs, options._grads_checked)
    options.switched_at_call = options._calls + 1  # the next call runs compiled
    options._switch_started = started
    # after the hooks the compile added (the first-call check's): the stall includes the check
    options._handle.remove()  # type: ignore[attr-defined]
    options._handle = model.register_forward_hook(options._hook, with_kwargs=True)
    _cleanup(options)


def _give_up(model: nn.Module, options: BackgroundCompile, why: str) -> None:
    _end(model, options, why)
    message = f"background compile of {type(model).__name__}: {why}; training goes on eagerly."
    warnings.warn(message, CompileCacheWarning, stacklevel=4)
    note_running_monitors(message)


# --- the worker process ---------------------------------------------------------------------------


def _model_source(model: nn.Module, options: BackgroundCompile) -> dict[str, Any]:
    if options.factory is not None:
        return {"factory": options.factory}
    config = model.config
    return {
        "class": f"{type(model).__module__}:{type(model).__qualname__}",
        "config_class": f"{type(config).__module__}:{type(config).__qualname__}",
        "config": config.to_dict(),
    }


def _cancel(model: nn.Module, options: BackgroundCompile) -> None:
    """``uncompile(model)``: no worker, no hook, no record (a switch undoing its own compile keeps
    them: it gives up with its reason)."""
    if options.state is BackgroundState.SWITCHING:
        return
    if options.state in (BackgroundState.WAITING, BackgroundState.COMPILING):
        _end(model, options, "cancelled (uncompile)")
    model.__dict__.pop(_ATTR, None)


def _end(model: nn.Module, options: BackgroundCompile, why: str) -> None:
    """Training stays eager: the after-call hook, the worker and its folder go."""
    options.state, options.eager_reason = BackgroundState.EAGER, why
    model.__dict__.pop(PENDING_ATTR, None)
    options._handle.remove()  # type: ignore[attr-defined]
    _stop(options)
    _cleanup(options)


def _stop(options: BackgroundCompile) -> None:
    if options._proc is not None:  # its own session: the compile workers go with it
        stop(options._proc)


def _cleanup(options: BackgroundCompile) -> None:
    if options in _RUNNING:
        _RUNNING.remove(options)
    if options._owned_dir and options._job is not None and _rank() in (None, 0):
        shutil.rmtree(options._job.parent, ignore_errors=True)


def _stop_all() -> None:
    for options in _RUNNING:
        _stop(options)
        _cleanup(options)


def _rank(*, at_start: bool = False) -> int | None:
    """This process's rank under ``torch.distributed``; at the compile call, before the process
    group may exist, the launcher's ``RANK`` (torchrun, accelerate, mp.spawn set it)."""
    dist = torch.distributed
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank()
    return int(os.environ["RANK"]) if at_start and "RANK" in os.environ else None
