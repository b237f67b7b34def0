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
import time
import warnings
from collections.abc import Callable, Hashable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from ..errors import CompiledMismatchError
from .comparator import TensorDiff, leaves
from .compare import (
    ReferenceUnavailable,
    Rerun,
    Sides,
    backend_name,
    compare,
    fork_rng,
    make_record,
    mismatch_message,
    random_note,
    rng_moved,
    rng_state,
    same_draws,
    set_rng_state,
)
from .equivalence import _loss
from .monitor import record_first_call_check
from .reference import at_precision, autocast_active, cast_floating, reference_dtype
from .trace_records import FirstCallCheck

__all__ = ["FirstCallVerifier", "copy_into", "distributed_initialized"]

logger = logging.getLogger(__name__)

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
        self.backend = backend_name(backend)
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
            rng_state=rng_state(self.model),
            buffers={n: b.detach().clone() for n, b in self.model.named_buffers()},
            autocast=autocast_active(self.model),
            grad_mode=torch.is_grad_enabled(),
        )
        pending.eager, pending.note = self._run(pending.run_eager, pending)
        if pending.drew:  # the compiled call draws the eager run's numbers (inductor: its graphs
            # compile with fallback_random), so the gradients that depend on them compare exactly
            pending.same_draws.enter_context(same_draws(self.backend))
        pending.check_seconds = time.perf_counter() - start
        pending.compiled_start = time.perf_counter()
        self._pending = pending

    def _run(self, call: Callable[[], Any], pending: _Pending) -> tuple[dict[str, Any], str]:
        """One run of the check's own from the state the compiled call started from (RNG, buffers):
        ``{"output": ..., "grad": ...}`` (detached), and why gradients were not taken, if they were
        wanted and could not be."""
        with self._aside(), fork_rng(self.model):
            set_rng_state(pending.rng_state)
            _restore_buffers(self.model, pending.buffers)
            output = call()
            after = rng_state(self.model)
            if pending.eager_rng_after is None:  # the first run: the eager one
                pending.eager_rng_after = after
                pending.drew = rng_moved(pending.rng_state, after)
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
        # a compiled call that drew what eager drew left the generator where eager left it
        pending.drew_alike = not rng_moved(pending.eager_rng_after, rng_state(self.model))
        with pending.same_draws:  # the compiled backward compiles in it too
            return self._compare(pending, output)

    def _compare(self, pending: _Pending, output: Any) -> Any:
        compiled_seconds = time.perf_counter() - pending.compiled_start
        start = time.perf_counter()
        if pending.drew and not pending.drew_alike:
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
        verdict = compare(
            Sides(
                eager={k: v for k, v in pending.eager.items() if k in compiled},
                compiled=compiled,
                reference=lambda dtype: self._reference(pending, dtype, compiled.keys()),
                precision=reference_dtype(self.model, autocast=pending.autocast),
                rerun=lambda: self._rerun(pending),
            )
        )
        if pending.drew:
            note = "; ".join(filter(None, [note, random_note(self.backend)]))
        seconds = pending.check_seconds + time.perf_counter() - start
        skipped = (
            pending.grads_wanted and "gradients" not in compared and note.startswith(_GRADS_FAILED)
        )
        self._conclude(
            pending.key,
            verdict.diffs,
            compared,
            note=note,
            check_seconds=seconds,
            compiled_seconds=compiled_seconds,
            partial=skipped,
            reference=verdict.describe_reference(),
        )
        return output

    def _reference(self, pending: _Pending, dtype: torch.dtype, keys: Any) -> dict[str, Any]:
        """The eager run again at ``dtype`` (the comparator's reference), as the first one ran:
        same inputs (cast, strides kept), RNG state, buffers and grad mode, autocast off."""
        args, kwargs = cast_floating(pending.args, dtype), cast_floating(pending.kwargs, dtype)
        with at_precision(self.model, dtype), torch.set_grad_enabled(pending.grad_mode):
            exact, note = self._run(lambda: pending.call_eager(*args, **kwargs), pending)
        if "grad" in keys and "grad" not in exact:  # a reference for the outputs alone is none
            name = str(dtype).removeprefix("torch.")
            raise ReferenceUnavailable(f"its gradients do not run in {name}: {note}")
        return {k: v for k, v in exact.items() if k in keys}

    def _rerun(self, pending: _Pending) -> Rerun:
        """Eager and the compiled call again from the same state: the run-to-run noise
        (nondeterministic kernels, atomics on a GPU)."""
        eager_again, _ = self._run(pending.run_eager, pending)
        compiled_again, _ = self._second_compiled_call(pending)
        return Rerun(eager=eager_again, compiled=compiled_again)

    def _skip_random(self, pending: _Pending, compiled_seconds: float) -> None:
        self.checked.add(pending.key)
        note = (
            f"the call draws random numbers (dropout) and backend {self.backend!r} drew them "
            "its own way (the generator ended elsewhere than after eager's run), so its results "
            "cannot be compared with eager's; run check_compile_equivalence(model, batch) "
            "(dropout off) to check it"
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
    note: str = ""
    check_seconds: float = 0.0
    compiled_start: float = 0.0
    drew: bool = False
    """The eager run moved a random generator (dropout, ``torch.rand``): detected from the
    generators' states, never from whether outputs happened to differ."""
    eager_rng_after: Any = None
    """The generators' states after the eager run."""
    drew_alike: bool = True
    """The compiled call left the generators where the eager run did: it drew the same numbers
    (measured after the call)."""
    same_draws: contextlib.ExitStack = field(default_factory=contextlib.ExitStack)
    """The settings under which the compiled call draws what eager drew; closed after it."""


# --- helpers -----------------------------------------------------------------------------------


def distributed_initialized() -> bool:
    return torch.distributed.is_available() and torch.distributed.is_initialized()


def _force_eager(call: Callable[..., Any], args: tuple, kwargs: dict) -> Any:
    with torch.compiler.set_stance("force_eager"):
        return call(*args, **kwargs)


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
