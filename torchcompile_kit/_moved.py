"""Every public keyword removed or renamed since the API was first published (commit bbc03ef), in
one table: a call that still passes one is refused by name with what to pass now, not with
Python's bare ``unexpected keyword argument``. CHANGELOG.md lists the same changes by release;
tests/test_moved.py calls each entry.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, TypeVar

__all__ = ["MOVED", "REMOVED", "refuses_moved"]

F = TypeVar("F", bound=Callable[..., Any])

_BATCHING = (
    "pass batching=Batching(batch_size=..., drop_last=..., max_tokens=...), the sampler's own "
    "(from torchcompile_kit import Batching)"
)
_GONE_FROM_COMPILE = {
    "nested": "compile_regional(nested=True) is gone: compile_model(model) gives one whole-model "
    "graph (torch.compiler.nested_compile_region stays public for the hybrid)",
    "remainder": "remainder=True is gone (it never paid, docs/regional.md): name the other modules "
    "in a blocks= list, e.g. blocks=['transformer.h.*', 'transformer.wte', 'lm_head']",
    "background": "background= moved: compile_in_background(model, compile_regional, ...) (or "
    "compile_model), with worker=BackgroundCompile(...)",
    "hook_guards": "compile_peft(hook_guards=False) is gone: the module hook guards are always on "
    "(tests/adapters/hook_guard_cost.py measures what they cost)",
}
_RUN_REQUEST = "pass request=RunRequest(recipe=..., spec=..., config=..., ...), one record"

MOVED: dict[str, dict[str, str]] = {
    "compile_regional": {k: _GONE_FROM_COMPILE[k] for k in ("nested", "remainder", "background")},
    "compile_model": {"background": _GONE_FROM_COMPILE["background"]},
    "compile_peft": {"hook_guards": _GONE_FROM_COMPILE["hook_guards"]},
    "compile_in_background": dict(_GONE_FROM_COMPILE),
    "check_compile_equivalence": {
        "rtol": "pass tolerance=(rtol, atol)",
        "atol": "pass tolerance=(rtol, atol)",
        "compile_kwargs": "pass torch.compile's keywords directly, e.g. mode='max-autotune'",
        "dropout": "dropout is always off (compiled random numbers need not match eager's)",
        "seed": "every run starts from seed 0",
    },
    "plan_buckets": dict.fromkeys(("batch_size", "drop_last", "max_tokens"), _BATCHING),
    "estimate_padding": dict.fromkeys(("batch_size", "drop_last", "max_tokens"), _BATCHING),
    "BucketBatchSampler": {
        "shuffle": "seed=None is the unshuffled order (shuffle=False); any other seed shuffles "
        "(shuffle=True, the default seed=0)",
    },
    "PadToBucketCollator": {
        "tokenizer": "pass pad_token_id=tokenizer.pad_token_id (and "
        "padding_side=tokenizer.padding_side)",
        "label_pad_token_id": "labels are always padded with -100, the index transformers' "
        "losses ignore",
    },
    "tune": {
        "out_dir": "tune() keeps no files: save_result(result, out_dir) writes tune.json, "
        "tune.txt, tune.png and recommended.py (from torchcompile_kit.tuning import save_result)",
        "verify": "run the recommendation afterwards with check_prediction(result) (from "
        "torchcompile_kit.tuning import check_prediction), also from a saved tune.json",
        "on_event": "progress goes to the 'torchcompile_kit.tuning' logger: "
        "logging.getLogger('torchcompile_kit.tuning').addHandler(...)",
    },
    "foreach_map_adam_step": {
        "beta1": "pass betas=(beta1, beta2)",
        "beta2": "pass betas=(beta1, beta2)",
    },
    "run_recipe_isolated": dict.fromkeys(
        ("recipe", "spec", "config", "compile_overrides", "plan_steps", "check", "pair_with"),
        _RUN_REQUEST,
    ),
}
"""Public name -> {removed keyword: what to pass now}."""

REMOVED: dict[str, str] = {
    "check_verify_arg": "the verify= flag check is internal (torchcompile_kit._checks.check_flag)",
    "verification_line": "torchcompile_kit.tuning.prediction_line(result.prediction_check)",
    "needs_reference": "torchcompile_kit.diagnostics.compare(Sides(...)) runs the reference "
    "when a tensor needs it",
}
"""Public functions removed since bbc03ef, and what to use instead (CHANGELOG.md)."""


def refuses_moved(function: F) -> F:
    """``function`` (or a class's ``__init__``), refusing a keyword of :data:`MOVED` by name.

    Example:
        >>> @refuses_moved
        ... def plan_buckets(lengths, *, batching=None): ...
        >>> plan_buckets([3], batch_size=8)
        Traceback (most recent call last):
        ...
        TypeError: plan_buckets(batch_size=...) was removed: pass batching=Batching(...
    """
    name = function.__qualname__.removesuffix(".__init__")
    table = MOVED[name]

    @functools.wraps(function)
    def checked(*args: Any, **kwargs: Any) -> Any:
        for key in kwargs:
            if key in table:
                raise TypeError(f"{name}({key}=...) was removed: {table[key]}")
        return function(*args, **kwargs)

    return checked  # type: ignore[return-value]
