"""Guard preflight: find per-instance state that would make repeated blocks recompile.

Dynamo specializes on int (and other constant) attributes of ``nn.Module``s
(``allow_unspec_int_on_nn_module=False``) and guards some per-instance objects by identity
(pytorch#163329), and its cache is per code object: all instances of a block class share one
budget of ``recompile_limit`` (8) entries. A block that reads a distinct ``self.layer_idx`` in
``forward`` therefore compiles once per layer until the limit, then silently runs eagerly.
"""

from __future__ import annotations

import functools
import inspect
import logging
import re
import warnings
from collections.abc import Hashable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from .. import _dynamo

__all__ = ["GuardFinding", "find_instance_variants", "preflight_group"]

logger = logging.getLogger(__name__)

_CONSTANT_TYPES = (bool, int, float, str, type(None))

# transformers attention modules read `layer_idx` only to index a KV cache; compile_regional
# disables the cache in forwards that do not generate, so these reads are not traced.
_CACHE_ONLY_ATTRS = frozenset({"layer_idx"})


@dataclass(frozen=True, slots=True)
class GuardFinding:
    """An attribute that differs between instances of a block class and is read by its code."""

    attribute: str
    """Path inside the block (``"attn.layer_idx"``)."""
    kind: str
    """``"constant"`` (dynamo specializes on the value) or ``"object"`` (guarded by identity)."""
    values: tuple[Hashable, ...]
    """The value per instance (``"<object>"`` for objects)."""
    cache_only: bool = False
    """transformers reads it only to index a KV cache (``layer_idx``)."""


def _value_key(value: Any) -> tuple[str, Hashable] | None:
    if isinstance(value, (torch.Tensor, nn.Module, type)):
        return None  # tensors are graph inputs, submodules are walked on their own
    if isinstance(value, _CONSTANT_TYPES):
        return ("constant", value)
    if isinstance(value, tuple) and all(isinstance(v, _CONSTANT_TYPES) for v in value):
        return ("constant", value)
    if callable(value):
        return ("object", id(value))  # calling it guards on its identity (pytorch#163329)
    return None  # other objects (configs) are guarded on the attributes read, by value


@functools.cache
def _is_read(cls: type, attribute: str) -> bool:
    """Whether a method of ``cls`` (other than ``__init__``) reads ``self.<attribute>``."""
    pattern = re.compile(rf"\bself\.{re.escape(attribute)}\b")
    for klass in cls.__mro__:
        if klass in (nn.Module, object):
            break
        for name, member in vars(klass).items():
            if name in ("__init__", "extra_repr") or not inspect.isfunction(member):
                continue
            try:
                source = inspect.getsource(member)
            except (OSError, TypeError):
                return True  # cannot tell: assume it is read
            if pattern.search(source):
                return True
    return False


def _instance_state(block: nn.Module) -> dict[str, tuple[type, str, tuple[str, Hashable]]]:
    state = {}
    for rel, sub in block.named_modules():
        for attr, value in vars(sub).items():
            if attr.startswith("_") or attr == "training":
                continue
            key = _value_key(value)
            if key is not None:
                state[f"{rel}.{attr}" if rel else attr] = (type(sub), attr, key)
    return state


def _structure(block: nn.Module) -> tuple[tuple[str, type], ...]:
    return tuple((name, type(sub)) for name, sub in block.named_modules())


def find_instance_variants(
    instances: Sequence[nn.Module], *, cache_disabled: bool = True
) -> tuple[list[GuardFinding], list[int]]:
    """Attributes that differ between instances and are read by their methods.

    Instances are first split by structure (T5's encoder and decoder blocks share a class but
    not their submodules: they are different graphs by construction); within each structure,
    attributes that differ and are read make variants.

    Args:
        instances: the blocks of one group.
        cache_disabled: transformers' cache-only attributes (``layer_idx``) are not reported.

    Returns:
        The findings and, per structure, ``[instances, variants]``.
    """
    by_structure: dict[tuple, list[nn.Module]] = {}
    for block in instances:
        by_structure.setdefault(_structure(block), []).append(block)
    findings: dict[str, GuardFinding] = {}
    counts: list[list[int]] = []
    for blocks in by_structure.values():
        states = [_instance_state(block) for block in blocks]
        differing: list[str] = []
        for path in sorted(states[0]):
            entries = [state[path] for state in states]
            keys = [entry[2] for entry in entries]
            owner, attr, (kind, _) = entries[0]
            if len(set(keys)) < 2 or not _is_read(owner, attr):
                continue
            cache_only = attr in _CACHE_ONLY_ATTRS and owner.__module__.startswith("transformers.")
            if cache_disabled and cache_only:
                continue
            differing.append(path)
            shown = tuple(k[1] if k[0] == "constant" else "<object>" for k in keys)
            findings.setdefault(path, GuardFinding(path, kind, shown, cache_only=cache_only))
        variants = {tuple(state[path][2] for path in differing) for state in states}
        counts.append([len(blocks), len(variants)])
    return list(findings.values()), counts


def _describe(finding: GuardFinding) -> str:
    if finding.kind == "object":
        return f"`{finding.attribute}` (a distinct object per block)"
    shown = ", ".join(map(repr, finding.values[:6])) + (", ..." if len(finding.values) > 6 else "")
    return f"`{finding.attribute}` (values {shown})"


def preflight_group(
    class_name: str,
    instances: Sequence[nn.Module],
    *,
    compile_kwargs: dict[str, Any],
    cache_disabled: bool = True,
) -> int | None:
    """Warn about per-instance guards in one block group; size its recompile limit if needed.

    Returns:
        A ``recompile_limit`` for this group's ``torch.compile`` calls when the variants (times
        two, for training and evaluation grad modes) exceed the global limit and the user did
        not set one; else ``None``.
    """
    findings, counts = find_instance_variants(instances, cache_disabled=cache_disabled)
    variants = sum(v for _, v in counts)
    if not findings:
        return None
    described = "; ".join(_describe(f) for f in findings)
    message = (
        f"{variants} of {len(instances)} {class_name} blocks differ in state their code reads: "
        f"{described}. Dynamo specializes on such attributes (ints/strings by value, objects by "
        f"identity), so the block compiles {variants} graphs instead of 1. Fix: pass the value as "
        "a forward argument or a tensor buffer, share one object across blocks, or select the "
        "variants as separate groups with blocks=."
    )
    if any(f.cache_only for f in findings):
        message += (
            " `layer_idx` is read only to index a KV cache: call the model with use_cache=False "
            "outside generation (compile_regional does so unless keep_kv_cache=True)."
        )
    if len(counts) > 1:
        message += f" ({len(counts)} block structures, each compiled on its own, are counted too.)"
    every_block_its_own = any(n >= 3 and v == n for n, v in counts)
    needed = 2 * variants  # each variant may also be seen in train and eval grad modes
    limit = _dynamo.recompile_limit()
    if every_block_its_own or needed > limit:
        warnings.warn(message, stacklevel=3)
    else:
        logger.info(message)
    if "recompile_limit" in compile_kwargs or needed <= limit:
        return None
    if _dynamo.recompile_limit_kwarg() is None:
        warnings.warn(
            f"{class_name}: {variants} variants may exceed dynamo's recompile limit ({limit}); "
            "this torch cannot raise it per compile call, so the last blocks may run eagerly. "
            "Fix the per-block state or raise torch._dynamo.config.recompile_limit.",
            stacklevel=3,
        )
        return None
    logger.info("%s: recompile_limit=%d for this group (%d variants)", class_name, needed, variants)
    return needed
