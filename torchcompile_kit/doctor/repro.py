"""The repro scripts: the culprit module compiled alone on the inputs it really received, judged
against eager and a float64 reference, failing (exit 1) while the problem reproduces.

``doctor_repro.py`` needs torch and the model's own code only (ready for an upstream report);
``doctor_replay.py`` replays the doctor's own trial through this library (the model around the
culprit included), for when the culprit needs its context to go wrong.
"""

from __future__ import annotations

import contextlib
import copy
import inspect
import json
import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from .._child import start, wait
from ..diagnostics import leaves
from .record import Trial

__all__ = ["ReproCheck", "capture_calls", "check_repro", "repro_judge", "write_repro"]

INPUTS = "doctor_repro_inputs.pt"

_REPLAY = '''"""doctor replay: {title}. Replays the doctor's trial (the model around the culprit
included) through torchcompile_kit. Run: python {name}  (exit 1 while it reproduces)."""

import json
import platform
import sys

import torch

from torchcompile_kit.doctor.trial import run_trial

REQUEST = json.loads({request!r})

print(f"torch {{torch.__version__}}, python {{platform.python_version()}}, {{platform.machine()}}")
outcome = run_trial(REQUEST)
print(json.dumps(outcome, indent=1))
sys.exit(1 if outcome["status"] not in ("ok", "eager-error") else 0)
'''

_STANDALONE = '''"""doctor repro: {title}.

Standalone: torch and the model's own code. Each module below is compiled alone and called on the
inputs it received in the model (saved in {inputs}, strides kept), forward and backward (with the
gradient its output received); outputs and gradients are compared with eager, both measured
against a float64 run. Run: python {name}  (exit 1 while it reproduces, 0 once fixed)."""

import contextlib
import copy
import importlib
import os
import platform
import sys

import torch

sys.path[:0] = {paths!r}
BACKEND = {backend!r}  # a torch.compile backend, or "module:attribute" of a backend callable
COMPILE_KWARGS = {compile_kwargs!r}
INDUCTOR_CONFIG = {inductor!r}  # torch._inductor.config settings the doctor's trial ran with
AUTOCAST = {autocast!r}  # torch.autocast dtype the model ran under, or None

print(f"torch {{torch.__version__}}, python {{platform.python_version()}}, {{platform.machine()}}, "
      f"cpu capability {{torch.backends.cpu.get_cpu_capability()}}")
CALLS = torch.load(os.path.join(os.path.dirname(os.path.abspath(__file__)), {inputs!r}),
                   weights_only=False)


def backend():
    if ":" not in BACKEND:
        return BACKEND
    module, _, attribute = BACKEND.partition(":")
    return getattr(importlib.import_module(module), attribute)


def tensors(tree):
    """The tensors of a nested value, in order (dicts, tuples, lists)."""
    if isinstance(tree, torch.Tensor):
        return [tree]
    if isinstance(tree, dict):
        tree = list(tree.values())
    return [t for item in tree for t in tensors(item)] if isinstance(tree, (list, tuple)) else []


def wide(tree):
    """Floating-point tensors in float64, strides kept."""
    if isinstance(tree, torch.Tensor):
        return tree.double() if tree.is_floating_point() else tree
    if isinstance(tree, dict):
        return {{key: wide(value) for key, value in tree.items()}}
    return type(tree)(wide(v) for v in tree) if isinstance(tree, (list, tuple)) else tree


def run(call, how):
    """Forward and backward of the module on its inputs: "eager", "compiled" or "float64"."""
    module, args, kwargs, grads = copy.deepcopy(
        (call["module"], call["args"], call["kwargs"], call["grads"]))
    if how == "float64":
        module, args, kwargs, grads = module.double(), wide(args), wide(kwargs), wide(grads)
    inputs = [t for t, needs in zip(tensors([args, kwargs]), call["needs_grad"]) if needs]
    for t in inputs:
        t.requires_grad_(True)
    if how == "compiled":
        torch._dynamo.reset()
        module = torch.compile(module, backend=backend(), **COMPILE_KWARGS)
    device = next((p.device.type for p in module.parameters()), "cpu")
    with contextlib.ExitStack() as scope:
        if AUTOCAST and how != "float64":
            scope.enter_context(torch.autocast(device, dtype=getattr(torch, AUTOCAST)))
        if INDUCTOR_CONFIG and how == "compiled":
            from torch._inductor import config

            scope.enter_context(config.patch(INDUCTOR_CONFIG))
        out = module(*args, **kwargs)
    outs = [t for t in tensors(out) if t.requires_grad]
    torch.autograd.backward(outs, [torch.zeros_like(o) if g is None else g.to(o.dtype)
                                   for o, g in zip(outs, grads)])
    found = {{f"output[{{i}}]": t.detach() for i, t in enumerate(tensors(out))}}
    found |= {{f"input grad[{{i}}]": t.grad for i, t in enumerate(inputs) if t.grad is not None}}
    found |= {{f"grad {{n}}": p.grad for n, p in module.named_parameters() if p.grad is not None}}
    call.setdefault("dtypes", {{}}).update(
        {{name.replace("_orig_mod.", ""): t.dtype for name, t in found.items() if how == "eager"}})
    return {{name.replace("_orig_mod.", ""): t.double() for name, t in found.items()}}


{judge}

failed = []
for call in CALLS:
    where = f"{{call['path'] or 'the model'}} ({{type(call['module']).__name__}})"
    exact, eager = run(call, "float64"), run(call, "eager")
    try:
        compiled = run(call, "compiled")
    except Exception as err:
        print(f"{{where}}: compiled raised {{type(err).__name__}}: {{str(err)[:500]}}")
        failed.append(where)
        continue
    for name, reference in exact.items():
        if name not in compiled:
            print(f"{{where}} {{name}}: missing from the compiled run")
            failed.append(where)
            continue
        wrong = repro_judge(eager[name], compiled[name], reference, dtype=call["dtypes"][name])
        if wrong:
            print(f"{{where}} {{name}}: {{wrong}}")
            failed.append(where)
print("REPRODUCES: " + ", ".join(sorted(set(failed))) if failed else "does not reproduce")
sys.exit(1 if failed else 0)
'''


def repro_judge(
    eager: torch.Tensor, compiled: torch.Tensor, reference: torch.Tensor, *, dtype: torch.dtype
) -> str:
    """The repro's verdict on one tensor (float64 values of a ``dtype`` tensor): ``""`` when it
    passes, else why. torch only: its source is written into ``doctor_repro.py``.

    The comparator's rule (diagnostics/comparator.py) with nothing of the library imported:
    a compiled tensor may be 3 times farther from the float64 run than eager is, plus a floor of
    one epsilon of its dtype times the reference's RMS (64 float32 ones for a one-element tensor,
    a sum in the compiler's order); within 16 epsilons of eager it passes as it is; under 100
    elements eager counts as at least 1e-6 of its size off; where eager has no correct digit,
    compiled may be 10 times farther. tests/doctor/test_repro_judge.py checks that it reaches
    the comparator's verdict on the same tensors.
    """

    def rms(t: torch.Tensor) -> float:
        return t.double().square().mean().sqrt().item() if t.numel() else 0.0

    if eager.shape != compiled.shape:
        return f"shape {tuple(compiled.shape)} compiled, {tuple(eager.shape)} eager"
    eps = torch.finfo(dtype).eps if dtype.is_floating_point else 0.0
    if torch.equal(eager, compiled):
        return ""
    scale, eager_error = rms(reference), rms(eager - reference)
    if dtype in (torch.float32, torch.float64) and rms(compiled - eager) <= 16 * eps * rms(eager):
        return ""  # rounding-level near eager: its last bits
    compiled_error = rms(compiled - reference)
    if compiled.numel() < 100:
        eager_error = max(eager_error, 1e-6 * scale)
    factor = 10.0 if eager_error >= scale > 0 else 3.0
    floor = (
        64 * min(eps, torch.finfo(torch.float32).eps) if compiled.numel() == 1 else eps
    ) * scale
    allowed = factor * eager_error + floor
    if compiled_error <= allowed:
        return ""
    return (
        f"compiled is {compiled_error:.3g} from float64, eager {eager_error:.3g} "
        f"(allowed {allowed:.3g})"
    )


@dataclass(kw_only=True, slots=True)
class ReproCheck:
    """What running a repro script gave."""

    fails: bool
    """It exited non-zero (or died): the problem reproduces."""
    output: str
    """The last lines it printed (or why it did not finish)."""


def capture_calls(
    model: nn.Module, batch: Any, paths: list[str], autocast: str | None
) -> list[dict[str, Any]]:
    """Run ``model`` eagerly on ``batch`` (forward and backward) and keep, for the first call of
    each module in ``paths``: a copy of the module, its inputs (strides kept) and the gradient
    its outputs received.

    Example:
        >>> calls = capture_calls(model, batch, ["blocks.2.gate"], None)  # doctest: +SKIP
        >>> sorted(calls[0])  # doctest: +SKIP
        ['args', 'grads', 'kwargs', 'module', 'needs_grad', 'path']
    """
    from .trial import call_model, loss_of

    copied = copy.deepcopy(model)
    copied.train()
    calls: dict[str, dict[str, Any]] = {}
    modules = {path: copy.deepcopy(copied.get_submodule(path)) for path in paths}  # no hooks

    def keep(path: str) -> Any:
        def hook(module: nn.Module, args: tuple, kwargs: dict, output: Any) -> None:
            if path in calls:  # the first call only
                return
            outs = [t for _, t in leaves(output) if t.requires_grad]
            calls[path] = {
                "path": path,
                "module": modules[path],
                "args": [_kept(a) for a in args],
                "kwargs": {k: _kept(v) for k, v in kwargs.items()},
                "needs_grad": [t.requires_grad for _, t in leaves([list(args), kwargs])],
                "grads": [None] * len(outs),
            }
            for index, tensor in enumerate(outs):
                tensor.register_hook(_keep_grad(calls[path]["grads"], index))

        return copied.get_submodule(path).register_forward_hook(hook, with_kwargs=True)

    handles = [keep(path) for path in paths]
    try:
        device = next((p.device.type for p in copied.parameters()), "cpu")
        with contextlib.ExitStack() as scope:
            if autocast:
                scope.enter_context(torch.autocast(device, dtype=getattr(torch, autocast)))
            loss = loss_of(call_model(copied, batch))
        loss.backward()
    finally:
        for handle in handles:
            handle.remove()
    return [calls[path] for path in paths if path in calls]


def _kept(value: Any) -> Any:
    """A tensor detached and copied with its strides (an expanded one: as a plain copy)."""
    if isinstance(value, torch.Tensor):
        value = value.detach()
        if 0 in value.stride() or not _dense(value):
            return value.clone()
        return torch.empty_strided(
            value.size(), value.stride(), dtype=value.dtype, device=value.device
        ).copy_(value)
    if isinstance(value, dict):
        return {k: _kept(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(_kept(v) for v in value)
    return value


def _dense(tensor: torch.Tensor) -> bool:
    """Non-overlapping and dense: its elements fill ``numel`` slots of its storage."""
    span = 1 + sum((size - 1) * stride for size, stride in zip(tensor.size(), tensor.stride()))
    return tensor.numel() == 0 or span == tensor.numel()


def _keep_grad(grads: list[Any], index: int) -> Any:
    def hook(grad: torch.Tensor) -> None:
        grads[index] = grad.detach().clone()

    return hook


def write_repro(
    folder: Path,
    calls: list[dict[str, Any]],
    trial: Trial,
    title: str,
    replay_request: dict[str, Any],
) -> tuple[Path, Path]:
    """Write ``folder/doctor_repro.py`` (standalone, with ``doctor_repro_inputs.pt``) for the
    captured ``calls`` compiled as ``trial`` says, and ``folder/doctor_replay.py`` for the
    doctor's own trial request. Returns both paths.

    Example:
        >>> write_repro(Path("out"), calls, trial, "miscompute", request)  # doctest: +SKIP
        (PosixPath('out/doctor_repro.py'), PosixPath('out/doctor_replay.py'))
    """
    torch.save(calls, folder / INPUTS)
    installed = (sys.prefix, sys.base_prefix, os.path.dirname(sys.executable))
    paths = [  # where the model's code is found (torch and the installed packages aside)
        os.getcwd(),
        *(p for p in sys.path if p and os.path.isdir(p) and not p.startswith(installed)),
    ]
    standalone = folder / "doctor_repro.py"
    standalone.write_text(
        _STANDALONE.format(
            title=title,
            inputs=INPUTS,
            name=standalone.name,
            paths=list(dict.fromkeys(paths)),
            backend=trial.backend,
            compile_kwargs=trial.compile_kwargs,
            inductor=trial.inductor,
            autocast=trial.autocast,
            judge=inspect.getsource(repro_judge),
        )
    )
    replay = folder / "doctor_replay.py"
    replay.write_text(
        _REPLAY.format(title=title, name=replay.name, request=json.dumps(replay_request))
    )
    return standalone, replay


def check_repro(script: Path, *, timeout_s: float, trace: Path | None = None) -> ReproCheck:
    """Run ``script`` in a process of its own (with ``TORCH_TRACE=trace`` for tlparse) and say
    whether it reproduces.

    Example:
        >>> check_repro(Path("out/doctor_repro.py"), timeout_s=600).fails  # doctest: +SKIP
        True
    """
    env = dict(os.environ)
    if trace is not None:
        env["TORCH_TRACE"] = str(trace)
    log = script.with_suffix(".log")
    with log.open("w") as sink:
        end = wait(
            start([sys.executable, str(script)], env=env, log=sink), timeout_s=timeout_s, log=log
        )
    lines = [line for line in log.read_text(errors="replace").splitlines() if line.strip()]
    said = "\n".join(lines[-6:])
    if end.hung_s is not None or end.signal is not None:
        said += f"\n({end.describe()})"
    return ReproCheck(fails=not end.ok, output=said)
