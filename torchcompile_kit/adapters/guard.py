"""Runtime checks on a compiled PEFT model: no stale graph, and the operations only safe in some
contexts.

Per-call hooks (``adapter_names=``) are guarded by compiling every region with hook guards on;
adapter attributes, ``requires_grad`` flips and in-place weight changes are guarded by dynamo
itself (docs/peft.md, "PEFT at run time", checks each against eager). What this decides is
recorded in the model's :class:`~.record.PeftCompileRecord`.
"""

from __future__ import annotations

import contextlib
from typing import Any

import torch
from torch import nn

from .. import _dynamo
from .._undo import register_undo
from ..diagnostics import FirstCallVerifier
from ..regional import cache_calls_compiled
from .evaluation import enforce, evaluate_rules, finding, rule_by_id
from .facts import describe_peft_model
from .record import RECORD_ATTR, AdapterState, PeftCompileRecord
from .schema import OnViolation, SafetyFinding

__all__ = ["GUARD_ATTR", "AdapterGuard"]

GUARD_ATTR = "_torchcompile_kit_adapter_guard"
# re-checked when adapters change after compiling; "already-compiled" is true by then
_NOT_RECHECKED = frozenset({"already-compiled", "not-peft-model"})


class AdapterGuard:
    """Checks made when a compiled PEFT model is used.

    Installed as bound methods of this object (a forward pre-hook, or the compiled call for a
    whole-model compile, and a wrapper of ``generate``), so ``copy.deepcopy`` of the
    model rebinds them to the copy.
    """

    def __init__(
        self,
        model: nn.Module,
        *,
        fullgraph: bool,
        regional: bool,
        on_violation: OnViolation,
        record: PeftCompileRecord,
        compile_kwargs: dict[str, Any],
        verify: bool = False,
    ) -> None:
        from peft.tuners.tuners_utils import BaseTunerLayer

        self.model = model
        self.fullgraph = fullgraph
        self.regional = regional
        self.on_violation = on_violation
        self.record = record
        self.compile_kwargs = compile_kwargs
        # one adapter layer stands for all: set_adapter/disable/merge act on every layer alike
        self.probe = next((m for m in model.modules() if isinstance(m, BaseTunerLayer)), None)
        self.warned: set[str] = set()
        self.originals: dict[str, Any] = {}
        self.compiled_call: Any = None
        self.hook: Any = None
        self.adapters = self._adapter_key()
        self.known = {(d.rule_id, d.message) for d in record.decisions}
        # the first call in each adapter state (a new graph) is compared with eager
        self.verifier = (
            FirstCallVerifier(
                model,
                recipe="compile_peft",
                backend=compile_kwargs.get("backend", "inductor"),
                state=self.verify_state,
            )
            if verify
            else None
        )

    def install(self) -> None:
        model = self.model
        setattr(model, GUARD_ATTR, self)
        setattr(model, RECORD_ATTR, self.record)
        if self.regional:
            for name in _dynamo.compiled_module_names(model):
                module = model.get_submodule(name)
                _dynamo.wrap_compiled_call(module, _dynamo.with_module_hook_guards)
            # the PeftModel's own forward stays eager: a pre-hook runs in Python on every call
            self.hook = model.register_forward_pre_hook(self.before_forward, with_kwargs=True)
            if self.verifier is not None:  # after the guard's hook: a refused call is not checked
                register_undo(model, self.verifier.install_hooks())
        else:
            # a pre-hook would be traced by dynamo (it runs inside the compiled _call_impl), so
            # the check goes in front of the compiled call instead
            call = _dynamo.get_compiled_call(model)
            self.compiled_call = _dynamo.with_module_hook_guards(call)
            if self.verifier is not None:
                self.compiled_call = self.verifier.wrap(self.compiled_call)
            _dynamo.set_compiled_call(model, self.call_compiled)
        if hasattr(model, "generate"):
            self.originals["generate"] = model.generate
            model.generate = self.generate
        register_undo(model, self.uninstall)

    def uninstall(self) -> None:
        """Remove the checks (run by ``uncompile``, after the compiled calls are gone)."""
        if self.hook is not None:
            self.hook.remove()
        for name in self.originals:
            self.model.__dict__.pop(name, None)  # the class's own method shows again
        self.model.__dict__.pop(GUARD_ATTR, None)
        self.model.__dict__.pop(RECORD_ATTR, None)

    # forward --------------------------------------------------------------------------------

    def before_forward(self, module: nn.Module, args: tuple, kwargs: dict[str, Any]) -> None:
        self.check_forward(kwargs)

    def call_compiled(self, *args: Any, **kwargs: Any) -> Any:
        self.check_forward(kwargs)
        return self.compiled_call(*args, **kwargs)

    def check_forward(self, kwargs: dict[str, Any], operation: str = "forward") -> None:
        found = []
        adapter_names = kwargs.get("adapter_names")
        if adapter_names is not None:
            shown = repr(list(adapter_names)[:6])
            if self.fullgraph:
                found.append(finding(rule_by_id("mixed-batch-fullgraph"), shown))
        adapters = self._adapter_key()
        if adapters != self.adapters:
            found += self._recheck()
        state = self._state(adapter_names)
        if state not in self.record.adapter_states:
            self.record.adapter_states.append(state)
        states, limit = len(self.record.adapter_states), self.record.recompile_limit
        if states > limit and "recompile-limit" not in self.warned:
            self.warned.add("recompile-limit")
            detail = f"{states} distinct adapter states (recompile_limit={limit})"
            found.append(finding(rule_by_id("recompile-limit"), detail))
        self._enforce(found, operation)
        self.adapters = adapters  # only once nothing was refused: a refusal repeats until fixed

    def _recheck(self) -> list[SafetyFinding]:
        """The static rules again, for adapters added or deleted after compiling."""
        facts = describe_peft_model(
            self.model,
            fullgraph=self.fullgraph,
            backend=self.compile_kwargs.get("backend", "inductor"),
            options=self.compile_kwargs.get("options"),
        )
        self.record.adapters = list(facts.peft_types)
        found = [f for f in evaluate_rules(facts) if f.rule_id not in _NOT_RECHECKED]
        return [
            f for f in found if (f.rule_id, f.message) not in self.known or f.severity == "refuse"
        ]

    def _enforce(self, found: list[SafetyFinding], operation: str, stacklevel: int = 4) -> None:
        self.known |= {(f.rule_id, f.message) for f in found}
        enforce(
            found,
            self.on_violation,
            subject=type(self.model).__name__,
            stacklevel=stacklevel,
            decisions=self.record.decisions,
            stage="runtime",
            operation=operation,
        )

    def _adapter_key(self) -> tuple[tuple[str, int], ...]:
        return tuple(
            (name, id(config)) for name, config in getattr(self.model, "peft_config", {}).items()
        )

    def verify_state(self, args: tuple, kwargs: dict[str, Any]) -> AdapterState:
        """The state a first-call check is made once for (a bound method: deepcopy rebinds it)."""
        return self._state(kwargs.get("adapter_names"))

    def _state(self, adapter_names: Any) -> AdapterState:
        names = tuple(adapter_names) if adapter_names is not None else None
        grad = torch.is_grad_enabled()
        if self.probe is None:
            return AdapterState(None, None, None, names, grad)
        probe = self.probe
        return AdapterState(
            tuple(probe.active_adapters), probe.disable_adapters, probe.merged, names, grad
        )

    # wrapped methods ------------------------------------------------------------------------

    def generate(self, *args: Any, **kwargs: Any) -> Any:
        found = []
        if not self.regional and "generate-uncompiled" not in self.warned:
            self.warned.add("generate-uncompiled")
            detail = f"a whole-model compiled {type(self.model).__name__}"
            found.append(finding(rule_by_id("generate-uncompiled"), detail))
        eager = self.regional and self.record.generate == "eager"
        if eager and "generate-eager" not in self.warned:
            self.warned.add("generate-eager")
            found.append(
                finding(
                    rule_by_id("generate-eager"), f"recompile_limit={self.record.recompile_limit}"
                )
            )
        if kwargs.get("adapter_names") is not None and self.fullgraph:
            found.append(
                finding(
                    rule_by_id("mixed-batch-fullgraph"), repr(list(kwargs["adapter_names"])[:6])
                )
            )
        adapters = self._adapter_key()  # generate() calls the base model: no forward pre-hook
        if adapters != self.adapters:
            found += self._recheck()
        self._enforce(found, "generate")
        self.adapters = adapters
        # the blocks' compiled calls are skipped, not dropped: forwards stay compiled after it
        stance = torch.compiler.set_stance("force_eager") if eager else contextlib.nullcontext()
        compiled = (
            cache_calls_compiled()
            if self.record.generate == "compiled"
            else contextlib.nullcontext()
        )
        with stance, compiled:
            return self.originals["generate"](*args, **kwargs)
