"""The worker of a background compile: ``python -m torchcompile_kit.regional.background_worker
FOLDER PID`` rebuilds the model ``FOLDER/model.json`` describes and compiles it as the training
process will (with ``precompile=True``), runs the training process's first batch (``batch.pt``)
through it in the state ``job.json`` records (its parameters' dtypes and ``requires_grad``, grad
mode, autocast), backward too as training did, and saves the compile cache. That first call is
checked against eager (``verify=True``: outputs and gradients; a difference raises and the worker
fails). ``result.json`` holds every region's key and the check's verdict (``status``;
``gradients_passed_in``: the state, ``[training, grad]``, whose gradients matched): the training
process compiles only regions with those keys, and then compares only the outputs of its first
compiled call in that state. Exit code 0 only when the artifact was written; it stops when the
training process (``PID``) is gone."""

from __future__ import annotations

import importlib
import io
import json
import os
import signal
import sys
import threading
import time
from pathlib import Path
from typing import Any

import torch

from .._factory import import_factory
from ..cache import read_signed, resolve_keys, save_compile_cache, write_signed
from ..diagnostics import first_call_checks_made
from .background import RECIPES
from .precompiled import regions_created


def main(folder: str, parent: int) -> int:
    _stop_with(parent)
    root = Path(folder)
    keys = resolve_keys(None, caller="background worker")  # the training process's, inherited
    spec = json.loads(read_signed(root / "model.json", keys))  # checked before it names code
    torch.set_num_threads(spec["threads"])  # the kernels are built for the training process's
    os.chdir(spec["cwd"])  # a factory's relative paths resolve as in the training process
    model = _build(spec["model"])
    job = json.loads(read_signed(root / "job.json", keys))
    model.to(job["device"])
    for name, param in model.named_parameters():
        dtype, requires_grad = job["parameters"].get(name, (None, param.requires_grad))
        if dtype is not None and str(param.dtype) != dtype:
            param.data = param.data.to(getattr(torch, dtype.removeprefix("torch.")))
        param.requires_grad_(requires_grad)
    model.train(job["training"])
    compile_fn = RECIPES[spec["recipe"]]
    with regions_created() as regions:
        compile_fn(model, precompile=True, verify=True, **spec["compile_kwargs"])
    batch = torch.load(
        io.BytesIO(read_signed(root / "batch.pt", keys)),
        map_location=job["device"],
        weights_only=False,
    )  # the training process's own objects, signature checked
    autocast = job["autocast"]
    with (
        first_call_checks_made() as checks,
        torch.set_grad_enabled(job["grad"]),
        torch.autocast(
            autocast["device_type"] if autocast else "cpu",
            dtype=getattr(torch, autocast["dtype"].removeprefix("torch.")) if autocast else None,
            enabled=autocast is not None,
        ),
    ):
        output = model(
            *batch["args"], **batch["kwargs"]
        )  # the first-call check raises on a difference
    passed = any(c.status == "passed" and "gradients" in c.compared for c in checks)
    write_signed(
        root / "result.json",
        json.dumps(
            {
                # every region's key, run or not (a loss the model computes itself never runs): the
                # training process compiles only when its own regions have the same keys
                "regions": {region.label: region.key for region in regions},
                "check": {
                    "status": checks[0].status if checks else None,
                    "gradients_passed_in": [job["training"], job["grad"]] if passed else None,
                },
            }
        ).encode(),
        keys,
    )
    if job["grad"]:
        _loss(output).backward()  # the backward graphs, as the training step compiles them
    saved = save_compile_cache(root / "compile-cache.tck", barrier=False)
    if not saved:
        print(f"the compile cache was not saved: {saved.reason}", file=sys.stderr)
        return 1
    return 0


def _stop_with(parent: int) -> None:
    """Once the training process ``parent`` is gone, stop this worker and the compile workers of
    its session: a training process killed outright (SIGKILL, the OOM killer, a job's time limit)
    runs no exit handler to stop it, and it would compile on for minutes on the CPUs or the GPU
    that the next run needs."""

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(1.0)
        os.killpg(0, signal.SIGKILL)  # this worker leads its own session and process group

    threading.Thread(target=watch, name="stop-with-training", daemon=True).start()


def _build(source: dict[str, Any]) -> torch.nn.Module:
    if "factory" in source:
        built = import_factory(source["factory"], flag="background")()
        return built[0] if isinstance(built, tuple) else built
    model_class = _named(source["class"])
    config = _named(source["config_class"]).from_dict(source["config"])
    return model_class(config)


def _named(text: str) -> Any:
    module, _, qualname = text.partition(":")
    found: Any = importlib.import_module(module)
    for part in qualname.split("."):
        found = getattr(found, part)
    return found


def _loss(output: Any) -> torch.Tensor:
    """A scalar whose backward runs every compiled backward graph of the step."""
    loss = getattr(output, "loss", None)
    if loss is None and isinstance(output, dict):
        loss = output.get("loss")
    if loss is not None:
        return loss
    tensors = (
        [output]
        if isinstance(output, torch.Tensor)
        else [
            t
            for t in (output.values() if isinstance(output, dict) else output)
            if isinstance(t, torch.Tensor)
        ]
    )
    return sum(t.float().sum() for t in tensors if t.requires_grad)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], parent=int(sys.argv[2])))
