"""The first-call check: a fragile recipe compares its compiled result with eager, once per state.

The first call in each state (grad mode and train/eval, or the adapter state) also runs an eager
reference on the same batch and weights, compares outputs and trainable gradients, and raises
:class:`~torchcompile_kit.errors.CompiledMismatchError` before the call returns. What it leaves
undisturbed (``.grad``, the RNG stream, buffers) and when it skips (random outputs under a backend
that draws its own way, ``torch.distributed``) is in docs/regional.md ("The first-call
check").
"""

from __future__ import annotations

import contextlib
import logging
import math
import time
import warnings
from collections.abc import Callable, Hashable, Iterator, Mapping
from typing import Any

import torch
from torch import nn

from ..errors import CompiledMismatchError
from .equivalence import _backend_name, _loss
from .monitor import record_first_call_check
from .tensor_diff import TensorDiff, compare_trees, leaves
from .trace_records import FirstCallCheck

__all__ = ["FirstCallVerifier", "check_verify_arg", "copy_into", "distributed_initialized", "make_record", "mismatch_message"]

logger = logging.getLogger(__name__)

# backends that draw random numbers exactly as eager does (their graphs run torch's own ops)
_RNG_EXACT_BACKENDS = frozenset({"eager", "aot_eager"})
StateFn = Callable[[tuple, dict], Hashable]
# the note of a gradient comparison that should have run and could not: the check is "partial"
_GRADS_FAILED = "gradients not compared, autograd refused"


def check_verify_arg(verify: Any, *, recipe: str) -> bool | None:
    """``verify`` if it is ``True``, ``False`` or ``None`` (the recipe's default), else ``TypeError``.

    Example:
        >>> check_verify_arg(None, recipe="compile_peft") is None
        True
    """
    if verify is None or isinstance(verify, bool):
        return verify
    raise TypeError(f"{recipe}: verify={verify!r} must be True (compare the first call with "
                    "eager), False (do not) or None (the recipe's default, see its docstring); "
                    f"got {type(verify).__name__}.")


def _default_state(args: tuple, kwargs: dict) -> Hashable:
    return torch.is_grad_enabled()


class FirstCallVerifier:
    """Compares a compiled model's first call in each state with an eager run of the same call.

    :meth:`wrap` wraps a compiled call (a whole model compiled in place); :meth:`install_hooks` adds
    forward hooks to a model whose inside is compiled. A state that passed is not checked again; one
    that failed raises again at its next call. ``state(args, kwargs)`` gives the key (with
    ``model.training``); ``backend`` decides whether RNG draws match eager. ``grads_checked``
    maps a key whose gradients were compared elsewhere (by a background worker, on the same batch
    and graphs) to where: its eager reference runs forward only, and the record says so.
    """

    def __init__(self, model: nn.Module, *, recipe: str, backend: Any, state: StateFn | None = None,
                 grads_checked: Mapping[Hashable, str] | None = None) -> None:
        self.model = model
        self.recipe = recipe
        self.backend = _backend_name(backend)
        self.state = state or _default_state
        self.grads_checked = dict(grads_checked or {})
        self.checked: set[Hashable] = set()
        self.records: list[FirstCallCheck] = []
        self._busy = False
        self._pending: _Pending | None = None
        self._warned_skip = False

    # -- the two ways in ----------------------------------------------------------------------

    def wrap(self, compiled_call: Callable[..., Any]) -> Callable[..., Any]:
        """A call that runs ``compiled_call`` and checks it when its state is new.

        The eager reference is ``compiled_call`` under ``torch.compiler.set_stance("force_eager")``.
        """

        def checked_call(*args: Any, **kwargs: Any) -> Any:
            if self._busy or not self._due(args, kwargs):
                return compiled_call(*args, **kwargs)
            self._begin(args, kwargs, lambda: _force_eager(compiled_call, args, kwargs),
                        rerun=lambda: compiled_call(*args, **kwargs))
            return self._finish(compiled_call(*args, **kwargs))

        return checked_call

    def install_hooks(self) -> Callable[[], None]:
        """Add the forward pre-hook (eager reference) and hook (comparison); return the removal."""
        model = self.model
        pre = model.register_forward_pre_hook(self._pre_hook, with_kwargs=True)
        post = model.register_forward_hook(self._post_hook, with_kwargs=True)

        def remove() -> None:
            pre.remove()
            post.remove()

        return remove

    def _pre_hook(self, module: nn.Module, args: tuple, kwargs: dict) -> None:
        self._pending = None
        if self._busy or not self._due(args, kwargs):
            return
        # the eager call runs the hooks again; _busy makes ours step aside
        self._begin(args, kwargs, lambda: _force_eager(module.forward, args, kwargs),
                    rerun=lambda: module(*args, **kwargs))

    def _post_hook(self, module: nn.Module, args: tuple, kwargs: dict, output: Any) -> None:
        if self._busy or self._pending is None:
            return
        self._finish(output)

    # -- the check ----------------------------------------------------------------------------

    def _due(self, args: tuple, kwargs: dict) -> bool:
        if torch.compiler.is_compiling():
            return False  # traced by an outer compile: the check is Python, not graph
        key = (self.model.training, self.state(args, kwargs))
        if key in self.checked:
            return False
        if distributed_initialized():
            self.checked.add(key)
            self._record(key, "skipped", note="torch.distributed is initialized: the check is "
                         "per rank and could make ranks diverge, so it does not run")
            return False
        return True

    def _begin(self, args: tuple, kwargs: dict, run_eager: Callable[[], Any], *,
               rerun: Callable[[], Any]) -> None:
        key = (self.model.training, self.state(args, kwargs))
        start = time.perf_counter()
        params = [(n, p) for n, p in self.model.named_parameters() if p.requires_grad]
        grads_wanted = torch.is_grad_enabled() and bool(params) and key not in self.grads_checked
        pending = _Pending(key=key, params=params)
        pending.rerun = rerun
        with self._aside(), _fork_rng(self.model):
            output = run_eager()
            if grads_wanted:
                pending.eager_grads, pending.note = _grads(output, params, retain=False)
            pending.eager_output = _detached(output)
            del output
        pending.grads_wanted = grads_wanted
        pending.run_eager = run_eager
        pending.rng_state = torch.random.get_rng_state()  # what the compiled call starts from
        pending.check_seconds = time.perf_counter() - start
        pending.compiled_start = time.perf_counter()
        self._pending = pending

    def _draws_its_own_random_numbers(self, pending: _Pending, diffs: list[TensorDiff]) -> bool:
        """Whether outputs that differ from eager's come from random numbers the backend draws
        its own way (dropout under inductor): an eager rerun from another seed then differs too.
        Asked only of a mismatch, so a passing check costs one eager run, not two."""
        if all(d.ok for d in diffs) or self.backend in _RNG_EXACT_BACKENDS or self.backend.startswith("aot_eager"):
            return False
        with self._aside(), _fork_rng(self.model), torch.no_grad():
            torch.manual_seed(torch.initial_seed() + 1)
            again = _detached(pending.run_eager())
        return any(d.max_abs > 0 for d in compare_trees("output", pending.eager_output, again, (0.0, 0.0)))

    def _finish(self, output: Any) -> Any:
        pending, self._pending = self._pending, None
        if pending is None:
            return output
        compiled_seconds = time.perf_counter() - pending.compiled_start
        start = time.perf_counter()
        diffs = compare_trees("output", pending.eager_output, _detached(output), (None, None))
        if self._draws_its_own_random_numbers(pending, diffs):
            self.checked.add(pending.key)
            note = (f"the model draws random numbers (dropout) and backend {self.backend!r} draws "
                    "them differently from eager, so the outputs cannot be compared; run "
                    "check_compile_equivalence(model, batch, dropout=False) to check it")
            self._record(pending.key, "skipped", note=note, compiled_seconds=compiled_seconds,
                         check_seconds=pending.check_seconds + time.perf_counter() - start)
            if not self._warned_skip:
                self._warned_skip = True
                warnings.warn(f"{self.recipe}: first-call check skipped: {note}", stacklevel=4)
            return output
        compared = ["outputs"]
        note = pending.note
        if pending.key in self.grads_checked and torch.is_grad_enabled():
            compared.append(f"gradients ({self.grads_checked[pending.key]})")
        if pending.eager_grads is not None:
            backward_start = time.perf_counter()
            compiled_grads, grad_note = _grads(output, pending.params, retain=True)
            if compiled_grads is None and "donated buffers" in grad_note:
                compiled_grads, grad_note = self._grads_of_a_second_call(pending)
            # the compiled backward's first run compiles it, which the user's backward then skips:
            # counted with the compiled call, not as the check's cost
            backward = time.perf_counter() - backward_start
            compiled_seconds += backward
            start += backward
            note = note or grad_note
            if compiled_grads is not None:
                compared.append("gradients")
                for (name, _), eager, compiled in zip(pending.params, pending.eager_grads, compiled_grads):
                    diffs += compare_trees(f"grad.{name}", eager, compiled, (None, None))
        seconds = pending.check_seconds + time.perf_counter() - start
        skipped = pending.grads_wanted and "gradients" not in compared and note.startswith(
            _GRADS_FAILED)
        self._conclude(pending.key, diffs, compared, note=note, check_seconds=seconds,
                       compiled_seconds=compiled_seconds, partial=skipped)
        return output

    def _grads_of_a_second_call(self, pending: _Pending) -> tuple[list[torch.Tensor | None] | None, str]:
        """The compiled gradients from a second compiled call on the same batch, not retained.

        A backward compiled with donated buffers (AOTAutograd frees saved tensors in it) refuses
        ``retain_graph=True``, which the check's backward on the user's output needs. The same
        graph runs again from the same RNG state (no compile), its backward runs once, and the
        buffers it changed are restored.
        """
        with self._aside(), torch.random.fork_rng(devices=[]), torch.enable_grad():
            torch.random.set_rng_state(pending.rng_state)
            again = pending.rerun()
            return _grads(again, pending.params, retain=False)

    @contextlib.contextmanager
    def _aside(self) -> Iterator[None]:
        """A run of the check's own: the buffers it changes (BatchNorm statistics) are restored
        after it, and the check's hooks step aside while it runs."""
        buffers = {n: b.detach().clone() for n, b in self.model.named_buffers()}
        self._busy = True
        try:
            yield
        finally:
            _restore_buffers(self.model, buffers)
            self._busy = False

    def _conclude(self, key: Hashable, diffs: list[TensorDiff], compared: list[str], *,
                  partial: bool = False, **extra: Any) -> None:
        failures = [d for d in diffs if not d.ok]
        status = "failed" if failures else "partial" if partial else "passed"
        record = self._record(key, status, diffs=diffs, compared=compared, **extra)
        if failures:
            raise CompiledMismatchError(mismatch_message(record, failures), record=record)
        if partial:
            warnings.warn(f"{self.recipe}: first-call check [{record.state}] compared the outputs "
                          f"only: {record.note}", stacklevel=5)
        self.checked.add(key)

    def _record(self, key: Hashable, status: str, *, diffs: list[TensorDiff] = (), **extra: Any) -> FirstCallCheck:
        record = make_record(self.recipe, self.backend, status, _describe_state(key), diffs, **extra)
        self.records.append(record)
        record_first_call_check(record)
        logger.info("%s", record.message())
        return record


class _Pending:
    __slots__ = ("check_seconds", "compiled_start", "eager_grads", "eager_output", "grads_wanted",
                 "key", "note", "params", "rerun", "rng_state", "run_eager")

    def __init__(self, *, key: Hashable, params: list[tuple[str, torch.Tensor]]) -> None:
        self.key = key
        self.params = params
        self.eager_output: Any = None
        self.eager_grads: list[torch.Tensor | None] | None = None
        self.note = ""
        self.check_seconds = 0.0
        self.compiled_start = 0.0
        self.grads_wanted = False
        self.rerun: Callable[[], Any] = lambda: None
        self.run_eager: Callable[[], Any] = lambda: None
        self.rng_state: torch.Tensor | None = None


# --- helpers -----------------------------------------------------------------------------------


def distributed_initialized() -> bool:
    return torch.distributed.is_available() and torch.distributed.is_initialized()


def _force_eager(call: Callable[..., Any], args: tuple, kwargs: dict) -> Any:
    with torch.compiler.set_stance("force_eager"):
        return call(*args, **kwargs)


def _fork_rng(model: nn.Module) -> Any:
    accelerators = {p.device for p in model.parameters() if p.device.type != "cpu"}
    if not accelerators:
        return torch.random.fork_rng(devices=[])
    device_type = next(iter(accelerators)).type
    indices = sorted({d.index or 0 for d in accelerators if d.type == device_type})
    return torch.random.fork_rng(devices=indices, device_type=device_type)


def _grads(output: Any, params: list[tuple[str, torch.Tensor]], *, retain: bool
           ) -> tuple[list[torch.Tensor | None] | None, str]:
    try:
        loss = _loss(output)
    except ValueError:
        return None, "gradients not compared: the output has no loss and no differentiable tensor"
    if loss.grad_fn is None:
        return None, "gradients not compared: the output does not depend on a trainable parameter"
    try:
        grads = torch.autograd.grad(loss, [p for _, p in params], retain_graph=retain, allow_unused=True)
    except RuntimeError as error:  # e.g. reentrant activation checkpointing refuses autograd.grad
        return None, f"{_GRADS_FAILED}: {str(error)[:200]}"
    if all(g is None for g in grads):  # reentrant checkpointing accumulates into .grad instead
        return None, (f"{_GRADS_FAILED}: no trainable parameter received a gradient from "
                      "torch.autograd.grad (reentrant activation checkpointing does this; "
                      "use_reentrant=False avoids it)")
    return [None if g is None else g.detach() for g in grads], ""


def _detached(tree: Any) -> Any:
    return {name: t.detach() for name, t in leaves(tree)}


def _restore_buffers(model: nn.Module, saved: dict[str, torch.Tensor]) -> None:
    with torch.no_grad():
        for name, buffer in model.named_buffers():
            old = saved.get(name)
            if old is not None and old.shape == buffer.shape and not torch.equal(old, buffer):
                buffer.copy_(old)


def copy_into(tensors: Mapping[str, torch.Tensor], values: Mapping[str, torch.Tensor]) -> None:
    for name, tensor in tensors.items():
        tensor.detach().copy_(values[name])


def _describe_state(key: Hashable) -> str:
    if isinstance(key, str):
        return key
    training, state = key
    if isinstance(state, bool):  # the default state: grad mode
        return f"{'train' if training else 'eval'} mode, grad {'on' if state else 'off'}"
    return f"{'train' if training else 'eval'} mode, {state!r}"


def make_record(recipe: str, backend: str, status: str, state: str, diffs: Any, **extra: Any) -> FirstCallCheck:
    worst = max(diffs, key=lambda d: d.ratio, default=None)
    return FirstCallCheck(
        recipe=recipe, status=status, state=state, torch_version=torch.__version__, backend=backend,
        tensors=len(diffs), failures=sum(1 for d in diffs if not d.ok),
        max_abs=max((d.max_abs for d in diffs), default=0.0),
        worst=worst.name if worst else "", worst_ratio=worst.ratio if worst else 0.0, **extra,
    )


def mismatch_message(record: FirstCallCheck, failures: list[TensorDiff], restored: bool = False) -> str:
    worst = max(failures, key=lambda d: d.ratio)
    largest = max(failures, key=lambda d: d.max_abs)
    shown = ", ".join(d.name for d in failures[:5]) + (", ..." if len(failures) > 5 else "")
    kept = ("the parameters and state were restored to before the step" if restored
            else "the call raised before returning its result")
    infinite = math.isinf(largest.max_abs)
    biggest = f"{largest.note}" if infinite else f"{largest.max_abs:.3g}"
    return (f"{record.recipe} computed a different result than eager at its first call "
            f"({record.state}) on torch {record.torch_version}, backend {record.backend!r}: "
            f"largest difference {biggest} in {largest.name!r} (worst {worst.name!r}, "
            f"{worst.ratio:.3g}x its tolerance); {len(failures)} of {record.tensors} tensors "
            f"outside tolerance: {shown}. Nothing was trained on it ({kept}). This torch/backend "
            "miscomputes this recipe: use another recipe or backend (e.g. "
            "compile_regional(model) block by block), report it with "
            "check_compile_equivalence(...).summary(), or pass verify=False to run it anyway.")
