"""``compile_optimizer``: a compiled ``optimizer.step`` that LR schedules never recompile.

A float ``lr`` (and OneCycleLR's ``betas``) is a constant in a compiled step, so a schedule
recompiles it, and a tensor ``lr`` breaks ``Adam(foreach=True)`` on CPU (docs/optimizer.md). During
each step the groups hold 0-d tensors owned by this module, filled with the values the scheduler
wrote; between steps they hold floats, so checkpoints load into plain ``torch.optim`` objects.
"""

from __future__ import annotations

import contextlib
import logging
import types
import warnings
from collections.abc import Callable, Iterator
from typing import Any, Literal

import torch

from .. import _dynamo
from .._checks import check_choice, check_compile_kwargs
from .._undo import register_undo
from ..diagnostics import allow_first_compile, check_in_place_update
from ..errors import UnsupportedOptimizerError

__all__ = ["compile_optimizer", "verify_next_step"]

# Optimizers whose compiled step is tested for parity and recompiles (tests/optim/test_compiled.py).
# Adam's subclasses (AdamW) share its hyperparameters; SGD keeps `momentum` a float because its
# step branches on `momentum != 0` in Python, which a tensor would turn into a graph break.
_SUPPORTED = (torch.optim.SGD, torch.optim.Adam, torch.optim.AdamW)
_IMPLS = ("step", "foreach_map")

# Marks the function installed as optimizer.step; also tells LRScheduler not to wrap it (it checks
# this attribute) since the installed step records `_opt_called` itself.
_SCHEDULER_WRAP_FLAG = "_wrapped_by_lr_sched"
_COMPILED_FLAG = "_torchcompile_kit_impl"
_RUNNER = "_torchcompile_kit_runner"  # on the installed step: its _CompiledStep
# Param-group keys set for the step only: what the device allows with a tensor lr.
_DEVICE_FLAGS = ("foreach", "capturable")

logger = logging.getLogger(__name__)


def compile_optimizer(
    optimizer: torch.optim.Optimizer,
    *,
    impl: Literal["step", "foreach_map"] = "step",
    scheduler: torch.optim.lr_scheduler.LRScheduler | None = None,
    static_grads: bool = False,
    verify: bool = False,
    **compile_kwargs: Any,
) -> torch.optim.Optimizer:
    """Replace ``optimizer.step`` with a compiled step that LR schedules do not recompile.

    During each step, ``lr`` (and Adam's ``betas``) are 0-d tensors owned by this module, filled
    with the group's current values, so a schedule never recompiles; Adam on CPU gets
    ``foreach=False`` and on CUDA/XPU ``capturable=True``. Between steps the groups hold what you
    and your scheduler put there, so checkpoints load into plain ``torch.optim`` objects and back.
    The first step (and any step that initialises state) runs eagerly; the step compiles at the next
    call, and inside :func:`~torchcompile_kit.no_recompiles` that first compile is allowed.
    ``monitor.record_for(optimizer)`` of a :class:`~torchcompile_kit.CompileMonitor` shows what the
    step compiled.

    Args:
        optimizer: ``torch.optim.SGD``, ``Adam`` or ``AdamW`` (``fused`` and ``differentiable``
            off); ``impl="foreach_map"`` takes Adam/AdamW without ``amsgrad``/``maximize``.
            accelerate's ``AcceleratedOptimizer`` is unwrapped (its ``.optimizer`` is compiled).
        impl: ``"step"`` compiles the optimizer's own ``step``; ``"foreach_map"`` compiles
            :func:`torchcompile_kit.optim.foreach_map_adam_step`, one horizontally fused update
            (experimental: ``foreach_map`` is a private torch API; the label can go when it is
            public).
        scheduler: the LR scheduler driving ``optimizer``, if any; checked to be bound to it.
        static_grads: mark every gradient as a static address so CUDA graphs do not copy them;
            useful only when gradients keep their storage (:func:`zero_grads_in_place`).
        verify: run the first compiled step eagerly too and compare updates and state; on a
            difference, restore parameters and state and raise ``CompiledMismatchError``. Off by
            default: it holds two more copies of the parameters and the optimizer state for
            that step.
        **compile_kwargs: passed to ``torch.compile`` unchanged (``backend``, ``mode``,
            ``options``, ``recompile_limit`` ...).

    Returns:
        The same ``optimizer``, its ``step`` replaced; :func:`~torchcompile_kit.uncompile` undoes
        it.

    Raises:
        UnsupportedOptimizerError: an optimizer or option not listed above, an unknown ``impl``,
            ``fullgraph=True`` with ``impl="step"``, a scheduler bound to another optimizer, or an
            optimizer already compiled.
        TypeError: ``verify`` is not ``True``, ``False`` or ``None``.

    Example:
        >>> model = torch.nn.Linear(4, 2)
        >>> opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
        >>> sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=100)
        >>> opt = compile_optimizer(opt, scheduler=sched, backend="aot_eager")
        >>> model(torch.randn(8, 4)).sum().backward()
        >>> opt.step(); sched.step(); opt.zero_grad()
    """
    wrapper, optimizer = optimizer, _unwrap_accelerated(optimizer)
    _check_arguments(optimizer, impl, scheduler, verify, compile_kwargs)
    runner = _CompiledStep(
        optimizer, impl=impl, static_grads=static_grads, verify=verify, **compile_kwargs
    )

    def step(self: torch.optim.Optimizer, closure: Callable[[], Any] | None = None) -> Any:
        return runner(closure)

    setattr(step, _SCHEDULER_WRAP_FLAG, True)
    setattr(step, _COMPILED_FLAG, impl)
    setattr(step, _RUNNER, runner)
    step.__doc__ = f"Compiled {type(optimizer).__name__}.step (torchcompile_kit, impl={impl!r})."
    optimizer.step = types.MethodType(step, optimizer)  # type: ignore[method-assign]
    hook = optimizer.register_load_state_dict_post_hook(runner.after_load_state_dict)

    def undo() -> None:
        optimizer.__dict__.pop("step", None)
        hook.remove()

    register_undo(optimizer, undo)
    return wrapper


def verify_next_step(optimizer: torch.optim.Optimizer) -> None:
    """Check the next compiled step of an optimizer ``compile_optimizer`` compiled against an eager
    step from the same start, as ``verify=True`` checks the first (tune's gate uses it on a run's
    optimizer). A wrong step raises ``CompiledMismatchError`` with the parameters and state
    restored.

    Example:
        >>> opt = compile_optimizer(torch.optim.SGD(model.parameters(), lr=0.1))  # doctest: +SKIP
        >>> verify_next_step(opt); opt.step()  # doctest: +SKIP
    """
    runner = getattr(getattr(_unwrap_accelerated(optimizer), "step", None), _RUNNER, None)
    if runner is None:
        raise TypeError(
            f"verify_next_step: this {type(optimizer).__name__} was not compiled by "
            "compile_optimizer; compile it first: compile_optimizer(optimizer)"
        )
    runner.check_next = True


def _unwrap_accelerated(optimizer: Any) -> Any:
    """The torch optimizer inside accelerate's ``AcceleratedOptimizer`` (``Trainer.optimizer``).

    The wrapper's ``step`` calls ``wrapper.optimizer.step``, so compiling the inner optimizer's
    step is what runs. With a GradScaler (fp16) the wrapper swaps the inner ``step`` it captured
    at ``prepare()`` back in, which would drop the compiled one: refused.
    """
    inner = getattr(optimizer, "optimizer", None)
    if type(optimizer).__name__ != "AcceleratedOptimizer" or inner is None:
        return optimizer
    if getattr(optimizer, "scaler", None) is not None:
        raise UnsupportedOptimizerError(
            "compile_optimizer: this AcceleratedOptimizer uses a GradScaler (fp16), which "
            "restores the step it captured at accelerator.prepare(); call compile_optimizer on "
            "the torch optimizer before accelerator.prepare(), or train in bf16"
        )
    return inner


def _check_arguments(
    optimizer: Any, impl: str, scheduler: Any, verify: bool, compile_kwargs: dict[str, Any]
) -> None:
    check_choice(
        "impl",
        impl,
        _IMPLS,
        error=UnsupportedOptimizerError,
        hint="use impl='step' (any supported optimizer) or impl='foreach_map' (Adam/AdamW)",
    )
    check_compile_kwargs(compile_kwargs, caller="compile_optimizer", flags={"verify": verify})
    if not isinstance(optimizer, _SUPPORTED):
        names = ", ".join(cls.__name__ for cls in _SUPPORTED)
        raise UnsupportedOptimizerError(
            f"compile_optimizer supports {names}; got {type(optimizer).__name__!r}. For other "
            f"optimizers wrap the step yourself: torch.compile(optimizer.step) with a tensor lr "
            f"(torch.optim accepts lr=torch.tensor(...) where the optimizer documents it)"
        )
    if hasattr(getattr(optimizer, "step", None), _COMPILED_FLAG):
        raise UnsupportedOptimizerError(
            f"compile_optimizer: this {type(optimizer).__name__}'s step is already compiled (impl="
            f"{getattr(optimizer.step, _COMPILED_FLAG)!r}); call compile_optimizer once per "
            f"optimizer, or torchcompile_kit.uncompile(optimizer) first to undo the earlier call"
        )
    for index, group in enumerate(optimizer.param_groups):
        for option in ("fused", "differentiable"):
            if group.get(option):
                raise UnsupportedOptimizerError(
                    f"compile_optimizer: {option}={group[option]!r} in param group {index} is not "
                    f"supported: "
                    + (
                        "a fused optimizer already runs one kernel per step and compiling it "
                        "only adds compile time; use it eagerly, or build it with fused=False "
                        "(HF Trainer's default optim='adamw_torch_fused': pass "
                        'TrainingArguments(optim="adamw_torch"))'
                        if option == "fused"
                        else "build the optimizer with differentiable=False"
                    )
                )
    if impl == "step" and compile_kwargs.get("fullgraph"):
        # torch/optim/optimizer.py::_use_grad_for_differentiable calls torch._dynamo.graph_break()
        # around every step (pytorch/pytorch#104053, so that in-place updates trace as an inference
        # graph). Remove this check once those breaks are gone (PRs #173388/#187513).
        raise UnsupportedOptimizerError(
            "compile_optimizer: fullgraph=True cannot compile "
            "optimizer.step, which contains two explicit graph breaks "
            "in torch; drop fullgraph, or use impl='foreach_map' "
            "(Adam/AdamW), whose step is one graph"
        )
    if impl == "foreach_map":
        from .foreach_adam import check_foreach_map_optimizer

        check_foreach_map_optimizer(optimizer)
    if scheduler is not None and getattr(scheduler, "optimizer", None) is not optimizer:
        raise UnsupportedOptimizerError(
            f"compile_optimizer: scheduler {type(scheduler).__name__!r} is bound to "
            f"{type(getattr(scheduler, 'optimizer', None)).__name__!r}, not to this optimizer; "
            f"pass the scheduler built on this optimizer"
        )


def _is_capturable_device(device: torch.device) -> bool:
    # The devices torch.optim's capturable mode accepts (torch/optim/optimizer.py).
    return device.type in ("cuda", "xpu", "hpu", "xla", _dynamo.privateuse1_backend_name())


class _CompiledStep:
    """The installed ``optimizer.step``: hyperparameter sync, eager init, compiled step."""

    def __init__(
        self,
        optimizer: torch.optim.Optimizer,
        *,
        impl: str,
        static_grads: bool,
        verify: bool = False,
        **compile_kwargs: Any,
    ) -> None:
        self.optimizer = optimizer
        self.verify = verify
        self.backend = compile_kwargs.get("backend", "inductor")
        self.is_adam = isinstance(optimizer, torch.optim.Adam)
        self.static_grads = static_grads
        self._grads_marked = False
        self._warned_realloc = False
        self._compiled_once = False
        self.check_next = False  # verify_next_step: the next compiled step is checked
        # The class's step (hooks included), not an instance wrapper an LR scheduler installed:
        # dynamo skips torch/optim/lr_scheduler.py, so tracing through that wrapper breaks.
        self.eager_step = type(optimizer).step.__get__(optimizer)
        if impl == "foreach_map":
            from .foreach_adam import make_foreach_map_step

            self.compiled_step: Callable[[], Any] = make_foreach_map_step(
                optimizer, **compile_kwargs
            )
        else:
            self.compiled_step = torch.compile(self.eager_step, **compile_kwargs)
        # Per param group: the tensors that stand for its hyperparameters during a step, and
        # the foreach/capturable its device needs with them.
        self._tensors: list[dict[str, Any]] = []
        self._flags: list[dict[str, bool]] = []

    def __call__(self, closure: Callable[[], Any] | None) -> Any:
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        self.optimizer._opt_called = True  # type: ignore[attr-defined]  # LRScheduler's check
        with self.step_hyperparameters():
            if self._state_missing():
                self.eager_step()
            else:
                if self.static_grads:
                    self._mark_static_grads()
                if self._compiled_once:
                    self._compiled_step(check=False)
                else:
                    # The first compile happens here, at the first step with state, which is
                    # inside the user's no_recompiles() block when the whole loop is: let it
                    # through (once; a later recompile still fails there). See no_recompiles.
                    with allow_first_compile():
                        self._compiled_step(check=self.verify)
                    self._compiled_once = True
        return loss

    def _compiled_step(self, *, check: bool) -> None:
        """A compiled step, compared with an eager step from the same start when ``check``
        (``verify``, at the first) or asked by :func:`verify_next_step`."""
        if not (check or self.check_next):
            self.compiled_step()
            return
        self.check_next = False
        tensors, params = self._step_tensors()
        # raises CompiledMismatchError with the parameters and state restored; at the first step
        # _compiled_once stays False, so the next step is checked again
        check_in_place_update(
            tensors,
            run_eager=self.eager_step,
            run_compiled=self.compiled_step,
            recipe=f"compile_optimizer({type(self.optimizer).__name__})",
            backend=self.backend,
            updates=params,
        )

    def _step_tensors(self) -> tuple[dict[str, torch.Tensor], frozenset[str]]:
        """What a step changes in place: parameters with a gradient and their state tensors."""
        tensors: dict[str, torch.Tensor] = {}
        params = set()
        for g, group in enumerate(self.optimizer.param_groups):
            for i, p in enumerate(group["params"]):
                if p.grad is None:
                    continue
                tensors[f"param.{g}.{i}"] = p
                params.add(f"param.{g}.{i}")
                for key, value in self.optimizer.state.get(p, {}).items():
                    if isinstance(value, torch.Tensor):
                        tensors[f"state.{g}.{i}.{key}"] = value
        return tensors, frozenset(params)

    # -- hyperparameters -------------------------------------------------------------------

    @contextlib.contextmanager
    def step_hyperparameters(self) -> Iterator[None]:
        """For one step: this module's tensors (and device flags) in every group, then back.

        Between steps every param group holds what the user and their scheduler put there
        (floats, the ``foreach``/``capturable`` they chose), exactly as in a plain optimizer, so
        ``state_dict()`` and a scheduler's ``base_lrs``/``_last_lr`` stay floats and load into a
        plain optimizer. During the step the group holds the same 0-d tensors every time, filled
        with the current values, so the compiled graph takes them as inputs and never recompiles.
        """
        saved = []
        for index, group in enumerate(self.optimizer.param_groups):
            if index == len(self._tensors):  # first sight: the first step, add_param_group
                self._tensors.append(self._make_tensors(group))
                self._flags.append(self._device_flags(group))
            saved.append(
                {k: group[k] for k in (*self._tensors[index], *_DEVICE_FLAGS) if k in group}
            )
            for key, tensor in self._tensors[index].items():
                current = group[key]
                if key == "betas":  # OneCycleLR/CyclicLR: (float, beta2) replaces the tuple
                    for t, value in zip(tensor, current):
                        if value is not t:
                            t.fill_(value)
                elif current is not tensor:
                    tensor.fill_(current)
                group[key] = tensor
            group.update(self._flags[index])
        try:
            yield
        finally:
            for group, values in zip(self.optimizer.param_groups, saved):
                group.update(values)

    def _make_tensors(self, group: dict[str, Any]) -> dict[str, Any]:
        device = group["params"][0].device if group["params"] else torch.device("cpu")
        # float64 on CPU keeps the exact value a scheduler computed (dynamo itself lifts floats
        # to float64 CPU tensors); accelerators get float32 on the device.
        dtype = torch.float64 if device.type == "cpu" else torch.float32

        def as_tensor(value: float | torch.Tensor) -> torch.Tensor:
            if isinstance(value, torch.Tensor) and value.dim() == 0:
                return value  # the user's own tensor: keep it, they may fill_ it themselves
            return torch.tensor(float(value), dtype=dtype, device=device)

        tensors: dict[str, Any] = {"lr": as_tensor(group["lr"])}
        if self.is_adam:
            tensors["betas"] = tuple(as_tensor(b) for b in group["betas"])
        return tensors

    def _device_flags(self, group: dict[str, Any]) -> dict[str, bool]:
        """What the group's device needs with a tensor lr (decided once per group, not per step)."""
        if not self.is_adam:
            return {}  # SGD's foreach path accepts a tensor lr on every device
        # An empty group (HF Trainer's no-decay group of a LoRA model) counts as on an
        # accelerator, as dynamo counts it: it sets capturable=True in a group whose params are
        # all on one and without state as it traces (torch/_dynamo/variables/optimizer.py,
        # _set_capturable), and all() of no params is True. Any other value, put back after each
        # step, fails that guard at the next: a recompile per step. An empty group computes
        # nothing either way.
        if all(_is_capturable_device(p.device) for p in group["params"]):
            return {"capturable": True}
        return {"foreach": False}

    # -- state ----------------------------------------------------------------------------

    def _state_missing(self) -> bool:
        """Whether a parameter with a gradient has no optimizer state yet (eager step then)."""
        state = self.optimizer.state
        for group in self.optimizer.param_groups:
            if self.is_adam:
                key = "step"
            elif group.get("momentum", 0) != 0:
                key = "momentum_buffer"
            else:
                continue  # plain SGD keeps no state
            for p in group["params"]:
                if p.grad is not None and key not in state.get(p, ()):
                    return True
        return False

    def after_load_state_dict(self, optimizer: torch.optim.Optimizer) -> None:
        """``load_state_dict`` post-hook: state saved with ``capturable=False`` keeps ``step`` on
        the CPU; the capturable step this module runs on an accelerator needs it on the device."""
        for group in optimizer.param_groups:
            if not self._device_flags(group).get("capturable"):
                continue
            for p in group["params"]:
                state = optimizer.state.get(p)
                if state and "step" in state and state["step"].device != p.device:
                    state["step"] = state["step"].to(p.device)

    # -- static grads ---------------------------------------------------------------------

    def _mark_static_grads(self) -> None:
        fresh = [
            p.grad
            for group in self.optimizer.param_groups
            for p in group["params"]
            if p.grad is not None and not hasattr(p.grad, "_dynamo_static_input_type")
        ]
        if fresh and self._grads_marked and not self._warned_realloc:
            self._warned_realloc = True
            warnings.warn(
                f"compile_optimizer(static_grads=True): {len(fresh)} gradient tensor(s) "
                "were re-allocated since the last step, so marking them static saves "
                "nothing; zero them in place with "
                "torchcompile_kit.optim.zero_grads_in_place(model) or "
                "optimizer.zero_grad(set_to_none=False)",
                RuntimeWarning,
                stacklevel=4,
            )
        for grad in fresh:
            _dynamo.mark_static_address(grad)
        self._grads_marked = True
