"""transformers-specific pieces: the explicit loss function, the KV-cache trap, block hints.

Nothing here imports transformers unless the model is a transformers model (it is then already
imported), so plain-torch users never pay for it.
"""

from __future__ import annotations

import inspect
import sys
import warnings
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from torch import nn

__all__ = [
    "disable_cache_in_plain_forwards",
    "fix_loss_function",
    "has_transformers_model",
    "no_split_module_names",
]

Undo = Callable[[], None]


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


def no_split_module_names(model: nn.Module) -> set[str]:
    """Class names listed in ``_no_split_modules`` by any transformers model inside ``model``."""
    names: set[str] = set()
    for module in _pretrained_modules(model):
        names.update(getattr(module, "_no_split_modules", None) or ())
    return names


def _resolved_loss(module: nn.Module) -> Callable[..., Any]:
    from transformers import PreTrainedModel
    from transformers.loss.loss_utils import LOSS_MAPPING

    if type(module).loss_function is not PreTrainedModel.loss_function:
        return module.loss_function  # a model that overrides the property knows best
    # PreTrainedModel.loss_function, without its warning_once for models whose class name does
    # not name a loss (GPT2LMHeadModel): that logging call is what breaks the graph.
    return LOSS_MAPPING.get(getattr(module, "loss_type", None), LOSS_MAPPING["ForCausalLM"])


def set_explicit_loss_functions(
    model: nn.Module, *, compile: bool = False, **compile_kwargs: Any
) -> list[Undo]:
    """Pin each transformers model's ``loss_function``; return how to undo it (internal)."""
    import torch

    undo: list[Undo] = []
    for module in _pretrained_modules(model):
        if not hasattr(type(module), "loss_function"):
            continue
        previous = module.__dict__.get("_loss_function", None)
        loss = _resolved_loss(module)
        module.loss_function = torch.compile(loss, **compile_kwargs) if compile else loss

        def restore(module: nn.Module = module, previous: Any = previous) -> None:
            if previous is None:
                module.__dict__.pop("_loss_function", None)
            else:
                module._loss_function = previous

        undo.append(restore)
    return undo


def fix_loss_function(model: nn.Module, *, compile: bool = False, **compile_kwargs: Any) -> nn.Module:
    """Set a transformers model's loss function explicitly so it no longer breaks the graph.

    ``PreTrainedModel.loss_function`` picks the loss from the class name in Python and logs a
    warning when the name does not say (``GPT2LMHeadModel``); under ``torch.compile`` that is a
    graph break in every training step. This resolves the loss once, eagerly, and pins it
    (``model.loss_function = ForCausalLMLoss``, as the seed post recommends).

    Args:
        model: a transformers model, or a module containing some (every one is fixed).
        compile: also compile the loss function (``torch.compile(loss, **compile_kwargs)``).
        **compile_kwargs: passed to ``torch.compile`` when ``compile=True``.

    Returns:
        ``model`` itself.

    Raises:
        ValueError: ``model`` contains no transformers ``PreTrainedModel``.

    Example:
        >>> model = fix_loss_function(GPT2LMHeadModel(config))  # doctest: +SKIP
        >>> compiled = torch.compile(model, fullgraph=True)  # no break at the loss  # doctest: +SKIP
    """
    if not set_explicit_loss_functions(model, compile=compile, **compile_kwargs):
        raise ValueError(
            f"fix_loss_function: {type(model).__name__} contains no transformers PreTrainedModel "
            "with a loss_function; for other models compile your loss with torch.compile(loss_fn)."
        )
    return model


# The forward argument a generation step passes its cache in, by transformers version.
_CACHE_ARGUMENTS = ("past_key_values", "cache")


class _PlainForwardsWithoutCache:
    """Forward pre-hook: ``use_cache=False`` unless the caller passed it or a cache."""

    def __init__(self, module: nn.Module) -> None:
        self.signature = inspect.signature(module.forward)
        self.warned = False

    def __call__(self, module: nn.Module, args: tuple, kwargs: dict[str, Any]):
        bound = self.signature.bind_partial(*args, **kwargs).arguments
        extra = bound.get("kwargs") if isinstance(bound.get("kwargs"), dict) else {}
        # generating: the cache is wanted (transformers < 5.24 names it past_key_values, 5.24 cache)
        if any(
            source.get(name) is not None
            for source in (bound, extra)
            for name in _CACHE_ARGUMENTS
        ):
            return None
        if bound.get("use_cache") is not None:  # the caller decided
            if bound["use_cache"] and not self.warned:
                self.warned = True
                warnings.warn(
                    f"{type(module).__name__} was called with use_cache=True outside generation: "
                    "it builds a cache whose per-layer state makes every compiled block "
                    "recompile (up to the recompile limit, then eager). Pass use_cache=False in "
                    "training and evaluation forwards.",
                    stacklevel=2,
                )
            return None
        if "use_cache" in bound and "use_cache" not in kwargs:
            return None  # passed positionally as None: leave the call as it is
        return args, {**kwargs, "use_cache": False}


def disable_cache_in_plain_forwards(
    model: nn.Module, *, compiled_regions: Iterable[str] = ()
) -> list[Undo]:
    """Make transformers forwards that do not generate run with ``use_cache=False`` (internal).

    With the default ``use_cache=True`` a decoder builds a ``DynamicCache`` even in a training
    forward; each block then guards on its own cache layer (``layers[i].is_initialized`` via
    ``self.layer_idx``) and recompiles once per layer. ``generate()`` passes a cache and is left
    alone; so is any call that passes ``use_cache`` itself.

    Args:
        model: the model.
        compiled_regions: qualified names of the modules compiled as regions. A transformers model
            inside one (a whole decoder selected with ``blocks=``) gets no hook: dynamo would trace
            it, and rewriting the call's keyword arguments breaks a ``fullgraph`` trace. Its
            parent's hook passes ``use_cache=False`` down to it instead.

    Returns:
        Callables that remove the hooks.
    """
    regions = tuple(compiled_regions)
    undo: list[Undo] = []
    for name, module in _named_pretrained_modules(model):
        if any(name == r or name.startswith(f"{r}.") or r == "" for r in regions):
            continue
        if "use_cache" in inspect.signature(module.forward).parameters:
            handle = module.register_forward_pre_hook(
                _PlainForwardsWithoutCache(module), with_kwargs=True
            )
            undo.append(handle.remove)
    return undo
