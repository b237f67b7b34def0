"""A ``--model`` factory for the warm-start benchmark: the 12-layer GPT-2 of the regional recipe.

GPT-2 with hidden 256, 12 layers, 4 heads, vocab 1024, random weights from a config, batches of 8
sequences of 128 tokens made in code. Used in docs/benchmarks.md to measure cold against warm
(from ``compile_cache``) first steps, full-model and regional, each in a fresh process::

    torchcompile-kit bench full full-warm regional regional-warm \\
        --model examples/gpt2_warm_start.py:gpt2_12_layers --out runs/warm-start
"""

from __future__ import annotations

from typing import Any


def gpt2_12_layers(n_layer: int = 12) -> tuple[Any, Any]:
    """``(model, make_batch)``: GPT-2 (hidden 256, ``n_layer`` layers) and its batches.

    Example:
        >>> model, make_batch = gpt2_12_layers()  # doctest: +SKIP
        >>> model(**make_batch(0)).loss  # doctest: +SKIP
    """
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    config = GPT2Config(
        vocab_size=1024,
        n_positions=256,
        n_embd=256,
        n_layer=n_layer,
        n_head=4,
        resid_pdrop=0.0,
        embd_pdrop=0.0,
        attn_pdrop=0.0,
        use_cache=False,
    )
    model = GPT2LMHeadModel(config)

    def make_batch(step: int) -> dict[str, torch.Tensor]:
        generator = torch.Generator().manual_seed(step)
        ids = torch.randint(0, 1024, (8, 128), generator=generator)
        return {"input_ids": ids, "labels": ids}

    return model, make_batch
