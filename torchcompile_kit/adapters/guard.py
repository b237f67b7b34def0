"""Runtime checks on a compiled PEFT model: the operations that are only safe in some contexts."""

from __future__ import annotations

from typing import Any

from torch import nn

from .. import _dynamo
from ..regional import register_undo
from .evaluation import enforce, finding, rule_by_id, rule_in_force
from .schema import OnViolation, Policy, SafetyFinding

__all__ = ["GUARD_ATTR", "AdapterGuard"]

GUARD_ATTR = "_torchcompile_kit_adapter_guard"


class AdapterGuard:
    """Checks made when a compiled PEFT model is used.

    Installed as bound methods of this object (a forward pre-hook, or the compiled call for a
    whole-model compile, and wrappers of a few ``PeftModel`` methods), so ``copy.deepcopy`` of the
    model rebinds them to the copy.
    """

    def __init__(
        self,
        model: nn.Module,
        *,
        policy: Policy,
        fullgraph: bool,
        regional: bool,
        on_violation: OnViolation,
    ) -> None:
        from peft.tuners.tuners_utils import BaseTunerLayer

        self.model = model
        self.policy = policy
        self.fullgraph = fullgraph
        self.regional = regional
        self.on_violation = on_violation
        # one adapter layer stands for all: set_adapter/disable/merge act on every layer alike
        self.probe = next((m for m in model.modules() if isinstance(m, BaseTunerLayer)), None)
        self.states: set[tuple[Any, ...]] = set()
        self.warned: set[str] = set()
        self.originals: dict[str, Any] = {}
        self.compiled_call: Any = None
        self.hook: Any = None

    def install(self) -> None:
        model = self.model
        setattr(model, GUARD_ATTR, self)
        if self.regional:
            # the PeftModel's own forward stays eager: a pre-hook runs in Python on every call
            self.hook = model.register_forward_pre_hook(self.before_forward, with_kwargs=True)
        else:
            # a pre-hook would be traced by dynamo (it runs inside the compiled _call_impl), so
            # the check goes in front of the compiled call instead
            self.compiled_call = _dynamo.get_compiled_call(model)
            _dynamo.set_compiled_call(model, self.call_compiled)
        methods = ["disable_adapter", "merge_and_unload"] + ([] if self.regional else ["generate"])
        for name in methods:
            if hasattr(model, name):
                self.originals[name] = getattr(model, name)
                setattr(model, name, getattr(self, name))
        register_undo(model, self.uninstall)

    def uninstall(self) -> None:
        """Remove the checks (run by ``uncompile``, after the compiled call is gone)."""
        if self.hook is not None:
            self.hook.remove()
        for name in self.originals:
            self.model.__dict__.pop(name, None)  # the class's own method shows again
        self.model.__dict__.pop(GUARD_ATTR, None)

    # forward --------------------------------------------------------------------------------

    def before_forward(self, module: nn.Module, args: tuple, kwargs: dict[str, Any]) -> None:
        self.check_forward(kwargs)

    def call_compiled(self, *args: Any, **kwargs: Any) -> Any:
        self.check_forward(kwargs)
        return self.compiled_call(*args, **kwargs)

    def check_forward(self, kwargs: dict[str, Any]) -> None:
        found = []
        adapter_names = kwargs.get("adapter_names")
        if adapter_names is not None:
            shown = repr(list(adapter_names)[:6])
            if self.fullgraph:
                found.append(finding(rule_by_id("mixed-batch-fullgraph"), shown))
            found += self._legacy("legacy-mixed-batch", shown)
        adapters = list(getattr(self.model, "peft_config", {}))
        if len(adapters) > 1:
            found += self._legacy("legacy-multiple-adapters", repr(adapters))
        self.states.add(self._state(adapter_names))
        limit = _dynamo.recompile_limit()
        if len(self.states) > limit and "recompile-limit" not in self.warned:
            self.warned.add("recompile-limit")
            detail = f"{len(self.states)} distinct adapter states (recompile_limit={limit})"
            found.append(finding(rule_by_id("recompile-limit"), detail))
        enforce(found, self.on_violation, subject=type(self.model).__name__)

    def _state(self, adapter_names: Any) -> tuple[Any, ...]:
        names = tuple(adapter_names) if adapter_names is not None else None
        if self.probe is None:
            return (names,)
        probe = self.probe
        return (tuple(probe.active_adapters), probe.disable_adapters, probe.merged, names)

    def _legacy(self, rule_id: str, detail: str) -> list[SafetyFinding]:
        rule = rule_by_id(rule_id)
        return [finding(rule, detail)] if rule_in_force(rule, policy=self.policy) else []

    # wrapped methods ------------------------------------------------------------------------

    def _checked_call(self, method: str, rule_id: str, *args: Any, **kwargs: Any) -> Any:
        enforce(
            self._legacy(rule_id, f"{method}()"),
            self.on_violation,
            subject=type(self.model).__name__,
            stacklevel=4,  # past this helper and the wrapper, to the user's call
        )
        return self.originals[method](*args, **kwargs)

    def disable_adapter(self, *args: Any, **kwargs: Any) -> Any:
        return self._checked_call("disable_adapter", "legacy-disable-adapter", *args, **kwargs)

    def merge_and_unload(self, *args: Any, **kwargs: Any) -> Any:
        return self._checked_call("merge_and_unload", "legacy-merge-and-unload", *args, **kwargs)

    def generate(self, *args: Any, **kwargs: Any) -> Any:
        if "generate-uncompiled" not in self.warned:
            self.warned.add("generate-uncompiled")
            detail = f"a whole-model compiled {type(self.model).__name__}"
            enforce(
                [finding(rule_by_id("generate-uncompiled"), detail)],
                self.on_violation,
                subject=type(self.model).__name__,
            )
        return self.originals["generate"](*args, **kwargs)
