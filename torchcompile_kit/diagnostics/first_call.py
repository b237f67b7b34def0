"""The first-call check: a fragile recipe compares its compiled result with eager, once per state.

The first call in each state (grad mode and train/eval, or the adapter state) also runs eagerly on
the same batch and weights, and once more at higher precision (the comparator's reference,
:mod:`.reference`); outputs and trainable gradients are judged by :mod:`.comparator`, and a tensor
the compiled run got wrong raises :class:`~torchcompile_kit.errors.CompiledMismatchError` before
the call returns. A failure is re-judged with the run-to-run noise measured (eager and the compiled
call rerun from the same state). What it leaves undisturbed (``.grad``, the RNG stream, buffers) and
when it skips (random outputs under a backend that draws its own way, ``torch.distributed``) is in
docs/regional.md ("The first-call check").
"""

from __future__ import annotations

import contextlib
import logging
import math
import time
import warnings
from collections.abc import Callable, Hashable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from .. import _dynamo
from ..errors import CompiledMismatchError
from .comparator import (
    NEAR_EPS,
    TensorDiff,
    judge_trees,
    leaves,
    needs_reference,
    rms_differences,
)
from .equivalence import _backend_name, _loss
from .monitor import record_first_call_check
from .reference import Reference, at_precision, autocast_active, cast_floating, reference_dtype
from .trace_records import FirstCallCheck

__all__ = [
    "FirstCallVerifier",
    "copy_into",
    "describe_reference",
    "distributed_initialized",
    "make_record",
    "mismatch_message",
]

logger = logging.getLogger(__name__)

# backends that draw random numbers exactly as eager does (their graphs run torch's own ops)
_RNG_EXACT_BACKENDS = frozenset({"eager", "aot_eager"})
StateFn = Callable[[tuple, dict], Hashable]
# the note of a gradient comparison that should have run and could not: the check is "partial"
_GRADS_FAILED = "gradients not compared, autograd refused"


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

    def __init__(
        self,
        model: nn.Module,
        *,
        recipe: str,
        backend: Any,
        state: StateFn | None = None,
        grads_checked: Mapping[Hashable, str] | None = None,
    ) -> None:
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

        The eager run is ``compiled_call`` under ``torch.compiler.set_stance("force_eager")``.
        """

        def checked_call(*args: Any, **kwargs: Any) -> Any:
            if self._busy or not self._due(args, kwargs):
                return compiled_call(*args, **kwargs)
            self._begin(
                args,
                kwargs,
                lambda *a, **k: _force_eager(compiled_call, a, k),
                rerun=lambda: compiled_call(*args, **kwargs),
            )
            try:
                output = compiled_call(*args, **kwargs)
            except BaseException:
                self._abandon()
                raise
            return self._finish(output)

        return checked_call

    def install_hooks(self) -> Callable[[], None]:
        """Add the forward pre-hook (eager runs) and hook (comparison); return the removal."""
        model = self.model
        pre = model.register_forward_pre_hook(self._pre_hook, with_kwargs=True)
        post = model.register_forward_hook(self._post_hook, with_kwargs=True)

        def remove() -> None:
            pre.remove()
            post.remove()

        return remove

    def _pre_hook(self, module: nn.Module, args: tuple, kwargs: dict) -> None:
        self._abandon()  # a checked call that raised left its pending check (and settings) open
        if self._busy or not self._due(args, kwargs):
            return
        # the eager call runs the hooks again; _busy makes ours step aside
        self._begin(
            args,
            kwargs,
            lambda *a, **k: _force_eager(module.forward, a, k),
            rerun=lambda: module(*args, **kwargs),
        )

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
            self._record(
                key,
                "skipped",
                note="torch.distributed is initialized: the check is "
                "per rank and could make ranks diverge, so it does not run",
            )
            return False
        return True

    def _begin(
        self, args: tuple, kwargs: dict, run_eager: Callable[..., Any], *, rerun: Callable[[], Any]
    ) -> None:
        """Before the compiled call: the eager run, from the current RNG state and buffers (kept
        for the runs the check may add after it: the reference, the noise)."""
        key = (self.model.training, self.state(args, kwargs))
        start = time.perf_counter()
        params = [(n, p) for n, p in self.model.named_parameters() if p.requires_grad]
        grads_wanted = torch.is_grad_enabled() and bool(params) and key not in self.grads_checked
        pending = _Pending(
            key=key,
            params=params,
            grads_wanted=grads_wanted,
            rerun=rerun,
            run_eager=lambda: run_eager(*args, **kwargs),
            args=args,
            kwargs=kwargs,
            call_eager=run_eager,
            rng_state=_rng_state(self.model),
            buffers={n: b.detach().clone() for n, b in self.model.named_buffers()},
            autocast=autocast_active(self.model),
            grad_mode=torch.is_grad_enabled(),
        )
        pending.eager, pending.note = self._run(pending.run_eager, pending)
        if pending.drew and self.backend == "inductor":
            # the compiled call draws the eager run's random numbers: its graphs compile with
            # inductor's fallback_random (torch's own random ops, not inductor's), so dropout's
            # masks match and the gradients that depend on them compare exactly
            pending.same_draws.enter_context(_dynamo.inductor_settings({"fallback_random": True}))
        pending.check_seconds = time.perf_counter() - start
        pending.compiled_start = time.perf_counter()
        self._pending = pending

    def _reference(self, pending: _Pending) -> None:
        """The eager run again at higher precision (the comparator's reference), as the first
        one ran: same inputs (cast, strides kept), RNG state, buffers and grad mode, autocast
        off."""
        pending.reference = reference_dtype(self.model, autocast=pending.autocast)
        dtype = pending.reference.dtype
        if dtype is None:
            return
        args, kwargs = cast_floating(pending.args, dtype), cast_floating(pending.kwargs, dtype)
        try:
            with at_precision(self.model, dtype), torch.set_grad_enabled(pending.grad_mode):
                pending.exact, _ = self._run(lambda: pending.call_eager(*args, **kwargs), pending)
        except Exception as error:  # noqa: BLE001 - a model that cannot run in dtype
            pending.reference = Reference(
                dtype=None,
                note=f"the model does not run in {pending.reference.name}: {_first_line(error)}",
            )

    def _run(self, call: Callable[[], Any], pending: _Pending) -> tuple[dict[str, Any], str]:
        """One run of the check's own from the state the compiled call started from (RNG, buffers):
        ``{"output": ..., "grad": ...}`` (detached), and why gradients were not taken, if they were
        wanted and could not be."""
        with self._aside(), _fork_rng(self.model):
            _set_rng_state(pending.rng_state)
            _restore_buffers(self.model, pending.buffers)
            output = call()
            pending.drew |= _rng_moved(pending.rng_state, _rng_state(self.model))
            grads, note = (
                _grads(output, pending.params, retain=False) if pending.grads_wanted else (None, "")
            )
            return _tree(output, pending.params, grads), note

    def _abandon(self) -> None:
        """Drop a pending check whose compiled call raised, and the settings it holds."""
        pending, self._pending = self._pending, None
        if pending is not None:
            pending.same_draws.close()

    def _finish(self, output: Any) -> Any:
        pending, self._pending = self._pending, None
        if pending is None:
            return output
        with pending.same_draws:  # the compiled backward compiles in it too
            return self._compare(pending, output)

    def _compare(self, pending: _Pending, output: Any) -> Any:
        compiled_seconds = time.perf_counter() - pending.compiled_start
        start = time.perf_counter()
        if pending.drew and not self._draws_alike():
            self._skip_random(pending, compiled_seconds)
            return output
        compiled = {"output": _detached(output)}
        compared = ["outputs"]
        note = pending.note
        if pending.key in self.grads_checked and torch.is_grad_enabled():
            compared.append(f"gradients ({self.grads_checked[pending.key]})")
        if pending.eager.get("grad") is not None:
            backward_start = time.perf_counter()
            compiled_grads, grad_note = _grads(output, pending.params, retain=True)
            if compiled_grads is None and "donated buffers" in grad_note:
                again, grad_note = self._second_compiled_call(pending)
                compiled_grads = None if again.get("grad") is None else list(again["grad"].values())
            # the compiled backward's first run compiles it, which the user's backward then skips:
            # counted with the compiled call, not as the check's cost
            backward = time.perf_counter() - backward_start
            compiled_seconds += backward
            start += backward
            note = note or grad_note
            if compiled_grads is not None:
                compared.append("gradients")
                compiled |= _tree(None, pending.params, compiled_grads)
        diffs = self._judge(pending, compiled)
        if needs_reference(diffs):  # not rounding-level near eager: ask the reference
            self._reference(pending)
            diffs = self._judge(pending, compiled)
        if any(not d.ok for d in diffs):
            diffs = self._judge(pending, compiled, noise=self._noise(pending, compiled))
        if pending.drew:
            note = "; ".join(filter(None, [note, self._random_note()]))
        seconds = pending.check_seconds + time.perf_counter() - start
        skipped = (
            pending.grads_wanted and "gradients" not in compared and note.startswith(_GRADS_FAILED)
        )
        self._conclude(
            pending.key,
            diffs,
            compared,
            note=note,
            check_seconds=seconds,
            compiled_seconds=compiled_seconds,
            partial=skipped,
            reference=describe_reference(pending.reference, diffs),
        )
        return output

    def _draws_alike(self) -> bool:
        """Whether the compiled call draws the random numbers eager drew from the same state:
        backends that run torch's own random ops, and inductor under ``fallback_random``."""
        return (
            self.backend in _RNG_EXACT_BACKENDS
            or self.backend.startswith("aot_eager")
            or self.backend == "inductor"
        )

    def _random_note(self) -> str:
        """What the record says of a call that drew random numbers (dropout)."""
        said = (
            "random numbers drawn (dropout): every run of the check started from the RNG state "
            "the compiled call started from"
        )
        if self.backend == "inductor":
            return said + (
                "; the graphs this call compiled use inductor's fallback_random (torch's own "
                "random ops), so they drew eager's numbers"
            )
        return said + f", and backend {self.backend!r} draws them as eager does"

    def _skip_random(self, pending: _Pending, compiled_seconds: float) -> None:
        self.checked.add(pending.key)
        note = (
            f"the call draws random numbers (dropout) and backend {self.backend!r} may draw "
            "them its own way, so its results cannot be compared with eager's; run "
            "check_compile_equivalence(model, batch) (dropout off) to check it"
        )
        self._record(
            pending.key,
            "skipped",
            note=note,
            compiled_seconds=compiled_seconds,
            check_seconds=pending.check_seconds,
        )
        if not self._warned_skip:
            self._warned_skip = True
            warnings.warn(f"{self.recipe}: first-call check skipped: {note}", stacklevel=5)

    def _judge(
        self, pending: _Pending, compiled: dict[str, Any], noise: dict[str, float] | None = None
    ) -> list[TensorDiff]:
        eager = {k: v for k, v in pending.eager.items() if k in compiled}
        exact = {k: v for k, v in pending.exact.items() if k in compiled} or None  # None: not run
        name = pending.reference.name if pending.reference is not None else ""
        return judge_trees("", eager, compiled, exact, reference_dtype=name, noise=noise)

    def _noise(self, pending: _Pending, compiled: dict[str, Any]) -> dict[str, float]:
        """The run-to-run noise of each tensor: eager against eager and the compiled call against
        itself, rerun from the same state (nondeterministic kernels, atomics on a GPU)."""
        eager_again, _ = self._run(pending.run_eager, pending)
        compiled_again, _ = self._second_compiled_call(pending)
        noise = rms_differences("", pending.eager, eager_again)
        for name, value in rms_differences("", compiled, compiled_again).items():
            noise[name] = max(value, noise.get(name, 0.0))
        return noise

    def _second_compiled_call(self, pending: _Pending) -> tuple[dict[str, Any], str]:
        """The compiled call again on the same batch, from the same RNG state (no compile), its
        gradients not retained; the buffers it changed are restored.

        Also how the compiled gradients are taken when the backward was compiled with donated
        buffers (AOTAutograd frees saved tensors in it), which refuses ``retain_graph=True``.
        """
        with torch.enable_grad() if pending.grads_wanted else contextlib.nullcontext():
            return self._run(pending.rerun, pending)

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

    def _conclude(
        self,
        key: Hashable,
        diffs: list[TensorDiff],
        compared: list[str],
        *,
        partial: bool = False,
        **extra: Any,
    ) -> None:
        failures = [d for d in diffs if not d.ok]
        status = "failed" if failures else "partial" if partial else "passed"
        record = self._record(key, status, diffs=diffs, compared=compared, **extra)
        if failures:
            raise CompiledMismatchError(mismatch_message(record, failures), record=record)
        if partial:
            warnings.warn(
                f"{self.recipe}: first-call check [{record.state}] compared the outputs "
                f"only: {record.note}",
                stacklevel=5,
            )
        self.checked.add(key)

    def _record(
        self, key: Hashable, status: str, *, diffs: list[TensorDiff] = (), **extra: Any
    ) -> FirstCallCheck:
        record = make_record(
            self.recipe, self.backend, status, _describe_state(key), diffs, **extra
        )
        self.records.append(record)
        record_first_call_check(record)
        logger.info("%s", record.message())
        return record


@dataclass(kw_only=True, slots=True)
class _Pending:
    """A check between its eager runs and the compiled call's result."""

    key: Hashable
    params: list[tuple[str, torch.Tensor]]
    grads_wanted: bool
    run_eager: Callable[[], Any]
    """The eager run on the call's own inputs."""
    call_eager: Callable[..., Any]
    """The eager run on given inputs (the reference's, cast)."""
    args: tuple
    kwargs: dict
    rerun: Callable[[], Any]
    rng_state: tuple[torch.Tensor, list[tuple[Any, int, torch.Tensor]]]
    buffers: dict[str, torch.Tensor]
    """The buffers as the compiled call found them (every run of the check starts from them)."""
    autocast: bool
    """Whether the call ran under autocast (the reference's precision depends on it)."""
    grad_mode: bool
    eager: dict[str, Any] = field(default_factory=dict)
    exact: dict[str, Any] = field(default_factory=dict)
    """The reference run's tree (empty until the reference runs: only when needed)."""
    reference: Reference | None = None
    """``None`` until the reference was asked for."""
    note: str = ""
    check_seconds: float = 0.0
    compiled_start: float = 0.0
    drew: bool = False
    """The eager run moved a random generator (dropout, ``torch.rand``): detected from the
    generators' states, never from whether outputs happened to differ."""
    same_draws: contextlib.ExitStack = field(default_factory=contextlib.ExitStack)
    """The settings under which the compiled call draws what eager drew; closed after it."""


# --- helpers -----------------------------------------------------------------------------------


def distributed_initialized() -> bool:
    return torch.distributed.is_available() and torch.distributed.is_initialized()


def _force_eager(call: Callable[..., Any], args: tuple, kwargs: dict) -> Any:
    with torch.compiler.set_stance("force_eager"):
        return call(*args, **kwargs)


def _accelerator(model: nn.Module) -> tuple[str, list[int]] | None:
    accelerators = {p.device for p in model.parameters() if p.device.type != "cpu"}
    if not accelerators:
        return None
    device_type = next(iter(accelerators)).type
    return device_type, sorted({d.index or 0 for d in accelerators if d.type == device_type})


def _fork_rng(model: nn.Module) -> Any:
    found = _accelerator(model)
    if found is None:
        return torch.random.fork_rng(devices=[])
    return torch.random.fork_rng(devices=found[1], device_type=found[0])


def _rng_state(model: nn.Module) -> tuple[torch.Tensor, list[tuple[Any, int, torch.Tensor]]]:
    """The CPU's RNG state and that of each accelerator the model is on: what every run of a
    check starts from, so dropout draws the same masks in each."""
    found = _accelerator(model)
    if found is None:
        return torch.random.get_rng_state(), []
    module = torch.get_device_module(found[0])
    return torch.random.get_rng_state(), [(module, i, module.get_rng_state(i)) for i in found[1]]


def _rng_moved(before: tuple[torch.Tensor, list], after: tuple[torch.Tensor, list]) -> bool:
    """Whether a generator's state differs between two :func:`_rng_state` readings."""
    if not torch.equal(before[0], after[0]):
        return True
    return any(not torch.equal(a[2], b[2]) for a, b in zip(before[1], after[1]))


def _set_rng_state(state: tuple[torch.Tensor, list[tuple[Any, int, torch.Tensor]]]) -> None:
    torch.random.set_rng_state(state[0])
    for module, index, device_state in state[1]:
        module.set_rng_state(device_state, index)


def _grads(
    output: Any, params: list[tuple[str, torch.Tensor]], *, retain: bool
) -> tuple[list[torch.Tensor | None] | None, str]:
    try:
        loss = _loss(output)
    except ValueError:
        return None, "gradients not compared: the output has no loss and no differentiable tensor"
    if loss.grad_fn is None:
        return None, "gradients not compared: the output does not depend on a trainable parameter"
    try:
        grads = torch.autograd.grad(
            loss, [p for _, p in params], retain_graph=retain, allow_unused=True
        )
    except RuntimeError as error:  # e.g. reentrant activation checkpointing refuses autograd.grad
        return None, f"{_GRADS_FAILED}: {str(error)[:200]}"
    if all(g is None for g in grads):  # reentrant checkpointing accumulates into .grad instead
        return None, (
            f"{_GRADS_FAILED}: no trainable parameter received a gradient from "
            "torch.autograd.grad (reentrant activation checkpointing does this; "
            "use_reentrant=False avoids it)"
        )
    return [None if g is None else g.detach() for g in grads], ""


def _detached(tree: Any) -> Any:
    return {name: t.detach() for name, t in leaves(tree)}


def _tree(
    output: Any, params: list[tuple[str, torch.Tensor]], grads: list[torch.Tensor | None] | None
) -> dict[str, Any]:
    """What a check compares of one run: ``{"output": {...}, "grad": {param name: grad}}``."""
    tree = {} if output is None else {"output": _detached(output)}
    if grads is not None:
        tree["grad"] = {name: grad for (name, _), grad in zip(params, grads)}
    return tree


def _first_line(error: BaseException) -> str:
    return (
        f"{type(error).__name__}: "
        f"{str(error).strip().splitlines()[0] if str(error).strip() else ''}"[:200]
    )


def _judged(reference: str) -> str:
    if reference.startswith("none"):
        return (
            "judged by the fixed tolerance: no float64 reference, "
            f"{reference.removeprefix('none ')}"
        )
    return f"judged against eager in {reference}, autocast off"


def describe_reference(reference: Reference | None, diffs: list[TensorDiff]) -> str:
    """A check record's ``reference``: its dtype, ``none (why)``, or why none was needed
    (``reference`` ``None`` or not ``needed``: every tensor was rounding-level near eager)."""
    if reference is None or not reference.needed:
        near = sum(d.judged_by == "eager" for d in diffs)
        return (
            f"not needed: {near} of {len(diffs)} tensors within {NEAR_EPS:g} epsilons of eager, "
            "the others exact"
            if near < len(diffs)
            else f"not needed: every tensor within {NEAR_EPS:g} epsilons of eager"
        )
    return reference.name or f"none ({reference.note})"


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
    return f"{'train' if training else 'eval'} mode, {state}"  # a state's str() is its words


def make_record(
    recipe: str, backend: str, status: str, state: str, diffs: Any, **extra: Any
) -> FirstCallCheck:
    worst = max(diffs, key=lambda d: d.ratio, default=None)
    return FirstCallCheck(
        recipe=recipe,
        status=status,
        state=state,
        torch_version=torch.__version__,
        backend=backend,
        tensors=len(diffs),
        failures=sum(1 for d in diffs if not d.ok),
        max_abs=max((d.max_abs for d in diffs), default=0.0),
        worst=worst.name if worst else "",
        worst_ratio=worst.ratio if worst else 0.0,
        **extra,
    )


def mismatch_message(
    record: FirstCallCheck, failures: list[TensorDiff], restored: bool = False
) -> str:
    worst = max(failures, key=lambda d: d.ratio)
    largest = max(failures, key=lambda d: d.max_abs)
    shown = ", ".join(d.name for d in failures[:5]) + (", ..." if len(failures) > 5 else "")
    kept = (
        "the parameters and state were restored to before the step"
        if restored
        else "the call raised before returning its result"
    )
    infinite = math.isinf(largest.max_abs)
    biggest = f"{largest.note}" if infinite else f"{largest.max_abs:.3g}"
    return (
        f"{record.recipe} computed a different result than eager at its first call "
        f"({record.state}) on torch {record.torch_version}, backend {record.backend!r}: "
        f"largest difference {biggest} in {largest.name!r}; worst {worst.explain()}; "
        f"{len(failures)} of {record.tensors} tensors wrong: {shown} "
        f"({_judged(record.reference)}). "
        f"Nothing was trained on it ({kept}). "
        "This torch/backend "
        "miscomputes this recipe: use another recipe or backend (e.g. "
        "compile_regional(model) block by block), report it with "
        "check_compile_equivalence(...).summary(), or pass verify=False to run it anyway."
    )
