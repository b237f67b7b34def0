"""transformers-specific pieces: the explicit loss function, the KV-cache trap, block hints.

Nothing here imports transformers unless the model is a transformers model (it is then already
imported), so plain-torch users never pay for it.
"""

from __future__ import annotations

import contextlib
import inspect
import logging
import sys
import warnings
from collections.abc import Callable, Iterable, Iterator
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any

from torch import nn

from .. import _dynamo
from ..diagnostics import mark_call, note_ran_eagerly
from .plan import ExtraRegion, RegionalPlan
from .precompiled import PrecompiledRegion, function_fingerprint, precompile_refusal

__all__ = [
    "TransformersPreparation",
    "prepare_transformers",
    "cache_calls_compiled",
    "disable_cache_in_plain_forwards",
    "fix_loss_function",
    "has_transformers_model",
    "run_cache_calls_eagerly",
]

Undo = Callable[[], None]

logger = logging.getLogger(__name__)


def _pretrained_modules(model: nn.Module) -> Iterator[nn.Module]:
    for _, module in _named_pretrained_modules(model):
        yield module


def _named_pretrained_modules(model: nn.Module) -> Iterator[tuple[str, nn.Module]]:
    if "transformers" not in sys.modules:  # a transformers model would have imported it
        return
    from transformers import PreTrainedModel

    for name, module in model.named_modules():
        if isinstance(module, PreTrainedModel):
            yield name, module


def has_transformers_model(model: nn.Module) -> bool:
    """Whether ``model`` is or contains a transformers ``PreTrainedModel`` (imports nothing).

    Example:
        >>> has_transformers_model(torch.nn.Linear(2, 2))  # doctest: +SKIP
        False
    """
    return next(_pretrained_modules(model), None) is not None


def _resolved_loss(module: nn.Module) -> Callable[..., Any]:
    from transformers import PreTrainedModel
    from transformers.loss.loss_utils import LOSS_MAPPING

    if type(module).loss_function is not PreTrainedModel.loss_function:
        return module.loss_function  # a model that overrides the property knows best
    # PreTrainedModel.loss_function, without its warning_once for models whose class name does
    # not name a loss (GPT2LMHeadModel): that logging call is what breaks the graph.
    return LOSS_MAPPING.get(getattr(module, "loss_type", None), LOSS_MAPPING["ForCausalLM"])


def set_explicit_loss_functions(
    model: nn.Module,
    *,
    compile: bool = False,
    precompile: bool = False,
    regions: list[tuple[str, str]] | None = None,
    limit: int | None = None,
    **compile_kwargs: Any,
) -> list[Undo]:
    """Pin each transformers model's ``loss_function``; return how to undo it (internal). With
    ``precompile`` (and where it can be), the compiled loss is a :class:`PrecompiledRegion`; with
    ``regions``, each compiled loss is a marked region (``mark_call``, under the recompile limit
    ``limit``) and ``(label, region id)`` is appended to it, for the measured report."""
    import torch

    undo: list[Undo] = []
    for path, module in _named_pretrained_modules(model):
        if not hasattr(type(module), "loss_function"):
            continue
        previous = module.__dict__.get("_loss_function", None)
        loss = _resolved_loss(module)
        if compile and precompile and precompile_refusal(compile_kwargs, None) is None:
            fields = function_fingerprint(loss, compile_kwargs)
            pinned = PrecompiledRegion(f"loss_{loss.__name__}", fields, compile_kwargs, call=loss)
        else:
            pinned = torch.compile(loss, **compile_kwargs) if compile else loss
        if compile and regions is not None:
            label = f"{path + '.' if path else ''}loss_function ({loss.__name__})"
            pinned, region = mark_call(pinned, label, limit=limit)
            regions.append((label, region))
        module.loss_function = pinned

        def restore(module: nn.Module = module, previous: Any = previous) -> None:
            if previous is None:
                module.__dict__.pop("_loss_function", None)
            else:
                module._loss_function = previous

        undo.append(restore)
    return undo


def fix_loss_function(
    model: nn.Module, *, compile: bool = False, **compile_kwargs: Any
) -> nn.Module:
    """Pin a transformers model's loss function so it no longer breaks the graph.

    ``PreTrainedModel.loss_function`` picks the loss from the class name in Python and warns when
    the name does not say (``GPT2LMHeadModel``): a graph break in every compiled training step. This
    resolves it once and pins it, as the reference post recommends.

    Args:
        model: a transformers model, or a module containing some (every one is fixed).
        compile: also compile the loss function with ``compile_kwargs``.
        **compile_kwargs: passed to ``torch.compile`` when ``compile=True``.

    Returns:
        ``model`` itself.

    Raises:
        ValueError: ``model`` contains no transformers ``PreTrainedModel``.

    Example:
        >>> model = fix_loss_function(GPT2LMHeadModel(config))  # doctest: +SKIP
        >>> compiled = torch.compile(model,  # doctest: +SKIP
        ...     fullgraph=True)  # no break at the loss
    """
    if not set_explicit_loss_functions(model, compile=compile, **compile_kwargs):
        raise ValueError(
            f"fix_loss_function: {type(model).__name__} contains no transformers "
            "PreTrainedModel with a loss_function; for other models compile your "
            "loss with torch.compile(loss_fn)."
        )
    return model


# The forward arguments a KV cache is passed in, by transformers version and module (a model's
# forward: past_key_values before transformers 5.24, cache from it; GPT-2's blocks: layer_past).
_CACHE_ARGUMENTS = ("past_key_values", "past_key_value", "cache", "layer_past")


class CacheArguments:
    """Where a module's ``forward`` takes a KV cache and ``use_cache`` (internal).

    Read once from the signature, so that checking a call costs a few dict lookups, not a bind.
    """

    def __init__(self, module: nn.Module) -> None:
        parameters = list(inspect.signature(module.forward).parameters.values())
        positional = [
            p.name for p in parameters if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)
        ]
        self.positions = {name: i for i, name in enumerate(positional)}
        self.cache_names = [p.name for p in parameters if p.name in _CACHE_ARGUMENTS]
        self.takes_kwargs = any(p.kind is p.VAR_KEYWORD for p in parameters)
        self.takes_use_cache = any(p.name == "use_cache" for p in parameters)

    @property
    def may_pass_cache(self) -> bool:
        """Whether a call could pass a cache at all."""
        return bool(self.cache_names) or self.takes_kwargs

    def _value(self, name: str, args: tuple, kwargs: dict[str, Any]) -> Any:
        if name in kwargs:
            return kwargs[name]
        position = self.positions.get(name)
        return args[position] if position is not None and position < len(args) else None

    def passes_cache(self, args: tuple, kwargs: dict[str, Any]) -> bool:
        """Whether this call hands the module a cache object (generation, or a model's blocks
        while it builds one)."""
        nested = kwargs.get("kwargs") if isinstance(kwargs.get("kwargs"), dict) else {}
        return any(self._value(n, args, kwargs) is not None for n in self.cache_names) or any(
            kwargs.get(n) is not None or nested.get(n) is not None for n in _CACHE_ARGUMENTS
        )

    def use_cache(self, args: tuple, kwargs: dict[str, Any]) -> tuple[bool, Any]:
        """``(given, value)``: whether the call passes ``use_cache``, and its value."""
        if "use_cache" in kwargs:
            return True, kwargs["use_cache"]
        position = self.positions.get("use_cache")
        if position is not None and position < len(args):
            return True, args[position]
        return False, None

    def builds_cache(self, module: nn.Module, args: tuple, kwargs: dict[str, Any]) -> bool:
        """Whether a model's call builds a cache once the library's hook has seen it: it asks for
        one, or it runs in eval mode and the config's ``use_cache`` is on (training forwards that
        do not ask get ``use_cache=False``)."""
        given, value = self.use_cache(args, kwargs)
        if given:
            return bool(value)
        config = getattr(module, "config", None)
        return not module.training and bool(getattr(config, "use_cache", False))


class _PlainForwardsWithoutCache:
    """Forward pre-hook: ``use_cache=False`` for training forwards that did not ask for a cache.

    A forward in eval mode, one that passes ``use_cache`` and a generation step (it passes a cache)
    are left as they are, so they return what eager returns, ``past_key_values`` included; the
    blocks run such calls eagerly (:func:`run_cache_calls_eagerly`), and the first plain forward
    that builds a cache says so once.
    """

    def __init__(self, arguments: CacheArguments, warned: list[bool]) -> None:
        self.arguments = arguments
        self.warned = warned  # shared by the hooks of one model: one warning per model

    def __call__(self, module: nn.Module, args: tuple, kwargs: dict[str, Any]):
        if self.arguments.passes_cache(args, kwargs):
            return None  # generating: the cache is wanted
        given, _ = self.arguments.use_cache(args, kwargs)
        if not given and module.training:
            return args, {**kwargs, "use_cache": False}
        if not self.warned and self.arguments.builds_cache(module, args, kwargs):
            self.warned.append(True)
            why = "use_cache=True" if given else "eval mode, and the config's use_cache=True"
            warnings.warn(
                f"{type(module).__name__} was called to build a KV cache ({why}): its "
                "regionally compiled blocks run such calls eagerly (compiled, the "
                "cache's per-layer state would make every block recompile), so the "
                "outputs, past_key_values included, are eager's. Pass use_cache=False "
                "(or set model.config.use_cache = False) where you need no "
                "past_key_values, to run the blocks compiled. Training forwards get "
                "use_cache=False unless they pass it.",
                stacklevel=2,
            )
        return None


def disable_cache_in_plain_forwards(
    model: nn.Module, *, compiled_regions: Iterable[str] = ()
) -> list[Undo]:
    """Make transformers training forwards that do not ask for a cache run with ``use_cache=False``.

    A default ``DynamicCache`` makes each block guard on its own cache layer and recompile once per
    layer. Eval-mode forwards, ``generate()`` and calls that pass ``use_cache`` are left alone; a
    transformers model inside a compiled region gets no hook (its parent passes
    ``use_cache=False``). Returns the hooks' removers.
    """
    regions = tuple(compiled_regions)
    warned: list[bool] = []
    undo: list[Undo] = []
    for name, module in _named_pretrained_modules(model):
        if any(name == r or name.startswith(f"{r}.") or r == "" for r in regions):
            continue
        arguments = CacheArguments(module)
        if arguments.takes_use_cache:
            handle = module.register_forward_pre_hook(
                _PlainForwardsWithoutCache(arguments, warned), with_kwargs=True
            )
            undo.append(handle.remove)
    return undo


_CACHE_CALLS_COMPILED: ContextVar[bool] = ContextVar("torchcompile_kit_cache_calls", default=False)


@contextlib.contextmanager
def cache_calls_compiled() -> Iterator[None]:
    """Inside it, calls that pass a KV cache run compiled, not eagerly (internal: ``compile_peft``
    with ``generate="compiled"``, whose blocks' recompile limit is sized for generation)."""
    token = _CACHE_CALLS_COMPILED.set(True)
    try:
        yield
    finally:
        _CACHE_CALLS_COMPILED.reset(token)


def run_cache_calls_eagerly(
    modules: Iterable[nn.Module], label: str, *, builds: bool = False
) -> None:
    """Make compiled transformers ``modules`` run the calls that pass (or, with ``builds``, would
    build) a KV cache eagerly: compiled, every block would recompile once per cache layer.
    ``uncompile`` removes it with the compiled call."""
    logged: list[bool] = []

    def dispatch(module: nn.Module, compiled: Callable[..., Any], arguments: CacheArguments):
        def call(*args: Any, **kwargs: Any) -> Any:
            eager = arguments.passes_cache(args, kwargs) or (
                builds and arguments.builds_cache(module, args, kwargs)
            )
            if not eager or _CACHE_CALLS_COMPILED.get():
                return compiled(*args, **kwargs)
            if not logged:
                logged.append(True)
                logger.info(
                    "%s: a call passes a KV cache (generation, or a forward that builds "
                    "one): run eagerly",
                    label,
                )
            note_ran_eagerly(module)
            return _dynamo.eager_call(module, *args, **kwargs)

        return call

    for module in modules:
        arguments = CacheArguments(module)
        if arguments.may_pass_cache:
            _dynamo.wrap_compiled_call(
                module, lambda compiled, m=module, a=arguments: dispatch(m, compiled, a)
            )


@dataclass(frozen=True, slots=True)
class TransformersPreparation:
    """What :func:`prepare_transformers` did: how to undo it, and the loss's compiled regions."""

    undo: Undo
    """Restores the loss functions and removes the ``use_cache`` hooks (last first)."""
    loss_regions: list[ExtraRegion]
    """The compiled loss functions, a measured report row each."""


def prepare_transformers(
    model: nn.Module,
    plan: RegionalPlan,
    *,
    compile_loss: bool,
    keep_kv_cache: bool,
    precompile: bool,
    compile_kwargs: dict[str, Any],
) -> TransformersPreparation:
    """Everything a transformers model needs around its compiled blocks, in one call: the blocks'
    calls that pass a KV cache run eagerly and plain training forwards run with
    ``use_cache=False`` (unless ``keep_kv_cache``), and the loss function is pinned and compiled
    (``compile_loss``; precompiled with ``precompile``). Nothing happens to a model without
    transformers parts. Returns the undo and the loss's regions (internal: ``compile_regional``).
    """
    undo: list[Undo] = []
    if not keep_kv_cache and has_transformers_model(model):
        for group in plan.groups:
            instances = [model.get_submodule(name) for name in group.names]
            run_cache_calls_eagerly(instances, group.class_name)
    regions: list[tuple[str, str]] = []
    if compile_loss:
        undo += set_explicit_loss_functions(
            model,
            compile=True,
            precompile=precompile,
            regions=regions,
            limit=plan.loss_limit,
            **compile_kwargs,
        )
    if not keep_kv_cache:
        undo += disable_cache_in_plain_forwards(model, compiled_regions=plan.blocks)

    def undo_all() -> None:
        for step in reversed(undo):
            step()

    loss_regions = [
        ExtraRegion(label=label, kind="function", region=region) for label, region in regions
    ]
    return TransformersPreparation(undo=undo_all, loss_regions=loss_regions)
