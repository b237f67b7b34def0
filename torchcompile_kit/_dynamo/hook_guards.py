"""Module hook guards while our compiled regions run.

Part of the one door to torch's private compiler APIs (see ``_dynamo/__init__.py``)."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import torch

__all__ = ["with_module_hook_guards"]


# --- module hook guards -------------------------------------------------------------------------
# Why: dynamo traces (inlines) the forward pre-hooks of the modules inside a compiled region, but
# by default it does not guard on the hook dicts (`skip_nnmodule_hook_guards=True`), so a graph
# traced without a hook keeps running after one is added, and vice versa. PEFT registers pre-hooks
# on every LoRA layer for each `adapter_names=` call and removes them after it: a compiled block
# then silently reuses the graph of the other case (max |diff| 0.39 on a tiny OPT). Turning the
# guards on only while *our* compiled regions are called (never globally) makes dynamo build hook
# guards for exactly those graphs; guards are built when a frame is compiled, so the switch only
# has to be on then, and it is on for every compile these wrappers trigger.
# Upstream: the switch, https://github.com/pytorch/pytorch/pull/97830; its default,
# https://github.com/pytorch/pytorch/pull/98371 ("silent correctness issues if users
# modify/remove their hooks later"); hooks ignored after compilation,
# https://github.com/pytorch/pytorch/issues/117758. Can go when dynamo guards hook changes by
# default (e.g. through module versioning, as #97830 proposes).


def with_module_hook_guards(compiled: Callable[..., Any]) -> Callable[..., Any]:
    """Wrap a compiled callable so dynamo guards on module hooks while it runs (and compiles).

    The switch is set for the duration of the call and restored after it, exceptions included.
    It is process-wide while set: a compile on another thread during the call also gets hook
    guards (more guards, never a wrong result).
    """
    config = torch._dynamo.config

    @functools.wraps(compiled)
    def call(*args: Any, **kwargs: Any) -> Any:
        prior = config.skip_nnmodule_hook_guards
        config.skip_nnmodule_hook_guards = False
        try:
            return compiled(*args, **kwargs)
        finally:
            config.skip_nnmodule_hook_guards = prior

    call.__torchcompile_kit_hook_guards__ = compiled  # type: ignore[attr-defined]
    return call
