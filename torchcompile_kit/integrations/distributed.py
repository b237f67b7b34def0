"""DDP and FSDP2 with regional compilation. DDP needs no helper (``DDP(compile_regional(model))``);
:func:`apply_fsdp2_regional` does torchtitan's order per block (docs/integrations.md, "FSDP2").
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from .._checks import check_module
from .._undo import register_undo
from ..regional import compile_regional, find_repeated_blocks, get_regional_plan

__all__ = ["apply_fsdp2_regional", "enable_activation_checkpointing"]


def enable_activation_checkpointing(model: nn.Module, *, blocks: Any = None) -> list[str]:
    """Checkpoint every repeated block's activations, in place (keys unchanged), before compiling.

    A transformers model uses its own ``activation_checkpointing_enable`` (inside the block's
    ``forward``); any other model runs each block's ``forward`` under non-reentrant
    ``torch.utils.checkpoint`` through one function shared by all blocks (a per-block object would
    recompile per block). :func:`~torchcompile_kit.uncompile` removes it.

    Args:
        model: the model, not yet compiled.
        blocks: ``None`` to discover the repeated blocks, or a ``blocks=`` selector (ignored for
            transformers models).

    Returns:
        The names of the checkpointed blocks (``[]`` for a transformers model: it chooses).

    Raises:
        TypeError: ``model`` is not an ``nn.Module``.
        NoRepeatedBlocksError: no repeated block was found and ``blocks`` was not given.

    Example:
        >>> enable_activation_checkpointing(model)  # doctest: +SKIP
        >>> compile_regional(model, backend="inductor")  # doctest: +SKIP
    """
    check_module("model", model)
    if callable(getattr(model, "activation_checkpointing_enable", None)):
        model.activation_checkpointing_enable(
            activation_checkpointing_kwargs={"use_reentrant": False}
        )
        register_undo(model, model.activation_checkpointing_disable)
        return []
    names = find_repeated_blocks(model, blocks).blocks
    for name in names:
        block = model.get_submodule(name)
        block.forward = _checkpointed_forward.__get__(block)  # type: ignore[method-assign]
        register_undo(model, lambda block=block: block.__dict__.pop("forward", None))
    return names


def _checkpointed_forward(self: nn.Module, *args: Any, **kwargs: Any) -> Any:
    # type(self).forward, not a stored bound method: one function for every block, and still
    # right after fully_shard swaps the class for FSDP<Block> (a subclass).
    return torch.utils.checkpoint.checkpoint(
        type(self).forward, self, *args, use_reentrant=False, **kwargs
    )


def apply_fsdp2_regional(
    model: nn.Module,
    *,
    checkpointing: bool = False,
    blocks: Any = None,
    compile_kwargs: dict[str, Any] | None = None,
    mesh: Any = None,
    reshard_after_forward: bool = True,
) -> nn.Module:
    """Activation checkpointing, then regional compile, then ``fully_shard`` per block and root.

    All in place: the returned model is ``model`` (its class becomes ``FSDP<Model>``), and
    ``state_dict()`` keys are the eager ones (values are ``DTensor`` shards).

    Args:
        model: the model on its device, not yet compiled or sharded; the process group initialized.
        checkpointing: checkpoint each block's activations
            (:func:`enable_activation_checkpointing`).
        blocks: ``None`` to discover the repeated blocks, or a ``blocks=`` selector.
        compile_kwargs: passed to :func:`~torchcompile_kit.compile_regional`.
        mesh: the ``DeviceMesh`` to shard over; ``None`` is all ranks.
        reshard_after_forward: free each block's gathered parameters after its forward (FSDP2's
            default); ``False`` keeps them until backward.

    Returns:
        ``model``, sharded, with its blocks compiled.

    Raises:
        TypeError: ``model`` is not an ``nn.Module``.
        ValueError: ``model`` is already compiled or a ``torch.compile`` wrapper.
        NoRepeatedBlocksError: no repeated block was found and ``blocks`` was not given.

    Example:
        >>> torch.distributed.init_process_group("gloo")  # doctest: +SKIP
        >>> model = apply_fsdp2_regional(model, checkpointing=True,
        ...                              compile_kwargs={"backend": "inductor"})  # doctest: +SKIP
    """
    from torch.distributed.fsdp import fully_shard

    check_module("model", model)
    if get_regional_plan(model) is not None:
        raise ValueError(
            f"{type(model).__name__} is already regionally compiled; "
            "apply_fsdp2_regional must checkpoint before it compiles. Call "
            "torchcompile_kit.uncompile(model) first, or pass the model before "
            "compile_regional."
        )
    if checkpointing:
        enable_activation_checkpointing(model, blocks=blocks)
    compile_regional(model, blocks=blocks, **(compile_kwargs or {}))
    plan = get_regional_plan(model)
    for name in plan.blocks:
        fully_shard(
            model.get_submodule(name), mesh=mesh, reshard_after_forward=reshard_after_forward
        )
    fully_shard(model, mesh=mesh, reshard_after_forward=reshard_after_forward)
    return model
