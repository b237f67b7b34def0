"""Inside a recipe's process: build the model and batches, apply the recipe, measure, report
(:func:`execute_request`, run as ``python -m torchcompile_kit.bench.execute REQUEST.json``).
"""

from __future__ import annotations

import contextlib
import importlib
import itertools
import os
import time
import traceback
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from .. import _dynamo
from ..cache import load_compile_cache, save_compile_cache
from ..diagnostics import CompileMonitor
from ..regional import BackgroundState, get_background_compile, get_regional_plan
from .batches import batch_stream, planned_tokens_per_step, seq_keys
from .captioner import PRESETS, build_captioner
from .metrics import measure_training
from .model_spec import ModelSpec, load_model_spec, loss_of
from .outcome import BackgroundUse, Metrics, RecipeResult, emit_event
from .recipes import RECIPES, Recipe, RecipeContext, apply_recipe

__all__ = ["execute_request", "missing_requirement"]


def missing_requirement(
    recipe: Recipe, *, device_type: str, spec: str | None, backend: str = "inductor"
) -> str | None:
    """Why ``recipe`` cannot run here (a sentence for the skipped row), or ``None`` when it can."""
    if "cuda" in recipe.requires and device_type != "cuda":
        return "needs CUDA graphs (mode='reduce-overhead'); this machine has no CUDA device"
    if recipe.world_size > 1 and device_type == "cuda":
        import torch

        gpus = torch.cuda.device_count()
        if gpus < recipe.world_size:
            return f"needs {recipe.world_size} GPUs (a process per GPU); this machine has {gpus}"
    if recipe.world_size > 1:
        import torch.distributed as dist

        if not dist.is_available():
            return "torch.distributed is not available in this torch build"
    return None


def _missing_lengths(recipe: Recipe, spec: ModelSpec) -> str | None:
    if recipe.data == "buckets" and spec.make_batch is not None and not spec.lengths:
        return (
            "plans buckets from the dataset's lengths; return them from the --model function "
            "as a third item: (model, make_batch, lengths)"
        )
    return None


class _Skip(Exception):
    """A requirement found missing once the model is built: the row is skipped, with the reason."""


def _device(kind: str) -> Any:
    """This process's device (``kind``: ``"cpu"`` or ``"cuda"``): its local rank's GPU, made the
    current device (NCCL, the compile cache's barrier and any bare ``.cuda()`` use it), or the
    CPU."""
    import torch

    if kind == "cuda":
        device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
        torch.cuda.set_device(device)
        return device
    return torch.device("cpu")


def _spec(request: dict[str, Any]) -> ModelSpec:
    if request["spec"]:
        return load_model_spec(request["spec"])
    preset = PRESETS[request["preset"]]
    return ModelSpec(
        source=f"captioner:{preset.name}", model=build_captioner(preset), make_batch=None
    )


@contextlib.contextmanager
def _distributed(recipe: Recipe, device: Any) -> Iterator[None]:
    if recipe.world_size == 1:
        yield
        return
    import torch.distributed as dist

    if device.type == "cuda":  # bound to this rank's GPU: its collectives never guess the device
        dist.init_process_group("nccl", device_id=device)
    else:
        dist.init_process_group("gloo")
    try:
        yield
    finally:
        dist.destroy_process_group()


def execute_request(request: dict[str, Any]) -> RecipeResult:
    """Run the recipe a runner request names, in this process, and return its :class:`RecipeResult`
    (the recipe's exceptions become ``failed`` results).

    With ``request["check"]`` (``"module:function"``) the weights are saved before the compile, and
    after the measurement the function is called as ``function(ctx, reference=, batch=, recipe=)``
    (``reference``: an eager model with those weights; ``batch``: the run's first batch); its
    JSON-able return is ``metrics.check``, an exception ``{"ok": False, "offending": ...}``.
    """
    recipe = RECIPES[request["recipe"]]
    preset = PRESETS[request["preset"]]
    device = _device(request["device"])
    settings = {
        "preset": preset.name,
        "backend": request["backend"],
        "compile_overrides": request["compile_overrides"],
        "device": str(device),
        "model": request["spec"] or f"captioner:{preset.name}",
        "data": recipe.data,
        "world_size": recipe.world_size,
    }
    result = RecipeResult(name=recipe.name, status="skipped", group=recipe.group, settings=settings)
    reason = missing_requirement(
        recipe, device_type=device.type, spec=request["spec"], backend=request["backend"]
    )
    if reason is not None:
        result.reason = reason
        return result
    try:
        with _distributed(recipe, device):
            result.metrics = _run(recipe, request, device, settings)
        result.status = "ok"
    except _Skip as skip:
        result.reason = str(skip)
    except Exception as err:  # noqa: BLE001 - a failing recipe is a row with its error, not a crashed bench
        result.status = "failed"
        tail = "".join(traceback.format_exception(err)[-6:])
        result.error = f"{type(err).__name__}: {err}"[:2000] + "\n" + tail[-3000:]
    return result


def _run(recipe: Recipe, request: dict[str, Any], device: Any, settings: dict[str, Any]) -> Metrics:
    preset = PRESETS[request["preset"]]
    steps, warmup_steps = request["steps"], request["warmup_steps"]  # the config's, resolved
    settings.update(steps=steps, warmup_steps=warmup_steps)
    notes: list[str] = []
    cache_path = Path(request["cache_dir"]) / f"{recipe.cache_from or recipe.name}.tckcache"
    pinned = request.get("pin")
    if (
        pinned
    ):  # the row trains on these CPUs; a background worker gets the others (MeasureConfig.pin)
        import torch

        os.sched_setaffinity(0, pinned[0])
        torch.set_num_threads(len(pinned[0]))
        if "background" in recipe.compile_kwargs and request["backend"] == "inductor":
            request["compile_overrides"] = {
                **request["compile_overrides"],
                "background": {"cpus": pinned[1]},
            }
    started = time.perf_counter()
    _dynamo.import_compiler()  # in every row, so no timed phase below carries the import
    import_s = time.perf_counter() - started
    # a warm row loads before the model is built, as a restart script does: the load starts
    # inductor's CPU ISA probe, which then runs beside the build (load_compile_cache)
    started = time.perf_counter()
    loaded = load_compile_cache(cache_path) if recipe.cache_from else None
    load_s = time.perf_counter() - started if recipe.cache_from else None
    if loaded is not None:
        notes.append(loaded.summary() if loaded else f"cache not loaded: {loaded.reason}")
    emit_event(event="phase", phase="build")
    started = time.perf_counter()
    spec = _spec(request)
    build_s = time.perf_counter() - started
    ctx, initial = _set_up(recipe, spec, request, device, notes)
    stream, prepare = batch_stream(recipe, spec, preset, device)
    first = next(stream)
    step = _train_step(recipe, ctx, device, spec)
    if _compiles(recipe):  # dynamo and inductor compile inside the first steps: say so first
        emit_event(
            event="phase", phase="first steps: compiling (minutes on a CPU for a large model)"
        )
    with CompileMonitor() as monitor:
        metrics = measure_training(
            step,
            itertools.chain([first], stream),
            warmup_steps=warmup_steps,
            steps=steps,
            device=device,
            before_first_step=(lambda: prepare(_forward_backward(step))) if prepare else None,
            on_step=lambda i, n, phase: emit_event(event="step", step=i, total=n, phase=phase),
            min_steady_s=float(request.get("steady_s") or 0.0),
            max_steps=int(request["plan_steps"]) if request.get("plan_steps") else None,
            baseline=_paired_baseline(recipe, request, preset, device),
            keep_going=_until_switched(ctx.model),
        )
    if metrics.paired is not None:  # whether each block's two sides stepped on the same samples
        metrics.paired.update(
            baseline=request["pair_with"],
            same_batches=recipe.data != "buckets" or spec.make_batch is not None,
        )
    if request.get("plan_steps"):
        metrics.plan_tokens_per_step = planned_tokens_per_step(
            recipe, spec, preset, device, int(request["plan_steps"])
        )
    snapshot = monitor.snapshot()
    metrics.graphs, metrics.recompiles = snapshot.get("graphs"), snapshot.get("recompiles")
    metrics.graph_breaks, metrics.compile_seconds = (
        snapshot.get("graph_breaks"),
        snapshot.get("compile_seconds"),
    )
    metrics.monitor, metrics.import_compiler_s, metrics.build_s = snapshot, import_s, build_s
    if monitor.first_call_checks:
        metrics.first_call_checks = [check.as_dict() for check in monitor.first_call_checks]
        notes += [check.message() for check in monitor.first_call_checks]
    background = get_background_compile(ctx.model)
    if background is not None:
        fields = [name for name in BackgroundUse.__dataclass_fields__ if name != "state"]
        metrics.background = BackgroundUse(
            state=background.state.value, **{name: getattr(background, name) for name in fields}
        )
    regions = {record["label"]: record["path"] for record in _dynamo.precompiled_regions()}
    plan = get_regional_plan(ctx.model)
    for group in plan.groups if plan is not None else ():
        compiled = group.compiled
        if compiled is not None and isinstance(compiled.precompile, str):  # refused: a sentence
            regions[group.class_name] = compiled.precompile
    metrics.regions = regions or None
    if loaded is not None:
        metrics.cache.load_s, metrics.cache.loaded = load_s, bool(loaded)
        metrics.cache.stats = loaded.cache_stats() if loaded else None  # FX-graph/AOT cache hits
    if recipe.save_cache:
        metrics.cache.saved = bool(save_compile_cache(cache_path))
    if request.get("check"):  # after the cache is saved: the check compiles nothing into it
        metrics.check = _check(request, ctx, initial, first, device)
    metrics.notes = notes
    return metrics


def _compiles(recipe: Recipe) -> bool:
    """Whether the recipe compiles anything (the model, its blocks or its optimizer step)."""
    return recipe.compile != "none" or recipe.optimizer in ("compiled", "foreach_map")


def _until_switched(model: Any) -> Any:
    """A background compile's row goes on until the model switched to compiled code (or gave up)."""
    record = get_background_compile(model)
    if record is None:
        return None
    return lambda: record.stall_s is None and record.state is not BackgroundState.EAGER


def _set_up(
    recipe: Recipe, spec: ModelSpec, request: dict[str, Any], device: Any, notes: list[str]
) -> tuple[RecipeContext, Path]:
    """The model on the device, its optimizer, the recipe applied (its warnings become notes),
    and where the weights it started from are saved for the check."""
    import torch

    if (reason := _missing_lengths(recipe, spec)) is not None:
        raise _Skip(reason)
    if "encoder_decoder" in recipe.requires and not (
        hasattr(spec.model, "encoder") and hasattr(spec.model, "decoder")
    ):
        raise ValueError(
            f"recipe {recipe.name!r} needs a model with .encoder and .decoder submodules"
        )
    model = spec.model.to(device)
    # the user's optimizer when the spec returns one (module.to() keeps its parameters)
    optimizer = spec.optimizer or torch.optim.Adam(model.parameters(), lr=1e-4)
    initial = Path(request["result_path"]).with_name("initial_state.pt")
    if request.get("check"):  # the weights the check's eager reference starts from
        torch.save(model.state_dict(), initial)
    ctx = RecipeContext(
        model=model,
        optimizer=optimizer,
        backend=request["backend"],
        overrides=dict(request["compile_overrides"]),
        device=device,
    )
    emit_event(event="phase", phase="compile" if _compiles(recipe) else "set up")
    with warnings.catch_warnings(record=True) as caught:  # the library's warnings become notes
        warnings.simplefilter("always")
        apply_recipe(recipe, ctx)
    for message in dict.fromkeys(
        str(w.message) for w in caught if issubclass(w.category, UserWarning)
    ):
        notes.append(f"warning: {message[:300]}")
    return ctx, initial


def _paired_baseline(recipe: Recipe, request: dict[str, Any], preset: Any, device: Any):
    """What builds the eager copy that steps beside the recipe (:mod:`.paired`), or ``None``.

    A fresh model from the same spec (the run's own is compiled in place), its own optimizer
    (the spec's, or ``Adam(lr=1e-4)``), the baseline recipe's batches; built after the warm-up.
    Not for the baseline itself, nor for DDP (its ranks step together).
    """
    name = request.get("pair_with")
    if not name or name == recipe.name or recipe.world_size > 1:
        return None
    base = RECIPES[name]

    def build():
        import torch

        spec = _spec(request)
        model = spec.model.to(device)
        optimizer = spec.optimizer or torch.optim.Adam(model.parameters(), lr=1e-4)
        ctx = RecipeContext(
            model=model,
            optimizer=optimizer,
            backend=request["backend"],
            overrides={},
            device=device,
        )
        # an eager recipe: nothing to set up
        stream, _ = batch_stream(base, spec, preset, device)
        return _train_step(base, ctx, device, spec), stream

    return build


def _check(
    request: dict[str, Any], ctx: RecipeContext, initial: Path, batch: dict[str, Any], device: Any
) -> dict[str, Any]:
    """``request["check"]`` on the run's compiled model and an eager one from the same weights."""
    import torch

    try:
        module, _, function = request["check"].rpartition(":")
        check = getattr(importlib.import_module(module), function)
        reference = _spec(request).model.to(device)
        reference.load_state_dict(torch.load(initial, map_location=device))
        batch = {k: v.to(device) if hasattr(v, "to") else v for k, v in batch.items()}
        return check(ctx, reference=reference, batch=batch, recipe=request["recipe"])
    except Exception as err:  # noqa: BLE001 - a run that cannot be checked is not correct
        return {"ok": False, "offending": f"{type(err).__name__}: {err}"[:500]}
    finally:
        initial.unlink(missing_ok=True)


def _train_step(recipe: Recipe, ctx: RecipeContext, device: Any, spec: ModelSpec):
    import torch

    from torchcompile_kit import mark_dynamic_batch
    from torchcompile_kit.optim import zero_grads_in_place

    autocast = (
        (lambda: torch.autocast("cuda", dtype=torch.bfloat16))  # the post's bf16 autocast
        if device.type == "cuda"
        else contextlib.nullcontext
    )

    def step(batch: dict[str, Any], *, update: bool = True) -> Any:
        batch = {
            k: v.to(device, non_blocking=True) if hasattr(v, "to") else v for k, v in batch.items()
        }
        if recipe.mark_dynamic:
            mark_dynamic_batch(batch, 1, keys=seq_keys(batch))
        if recipe.zero_grads_in_place:
            zero_grads_in_place(ctx.model)
        else:
            ctx.optimizer.zero_grad()
        with autocast():
            loss = loss_of(ctx.model(**batch))
        loss.backward()
        if update:
            ctx.optimizer.step()
        else:  # a warm-up pass compiles the graphs without training on the batch
            ctx.optimizer.zero_grad()
        return loss.detach()

    return step


def _forward_backward(step):
    return lambda batch: step(batch, update=False)


def _child_main(request_path: str) -> int:
    """The recipe's process: run the request in this process and write its result (rank 0)."""
    import json

    request = json.loads(Path(request_path).read_text())
    result = execute_request(request)
    if int(os.environ.get("RANK", "0")) == 0:
        Path(request["result_path"]).write_text(json.dumps(result.as_dict(), indent=2, default=str))
    return 0


if __name__ == "__main__":
    import sys

    raise SystemExit(_child_main(sys.argv[1]))
