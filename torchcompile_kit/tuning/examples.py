"""``--model`` factories for trying ``tune`` (and the bench) without a model of your own
(docs/tune.md, "Try it without a model of your own"). Nothing downloads; the data is made in code
and the same for a given step in every process.
"""

from __future__ import annotations

import random
from typing import Any

from ..bench import PRESETS, RECIPES, ModelSpec, batch_stream, build_captioner, caption_length_mix

__all__ = ["captioner_tiny", "tiny_llama", "tiny_llama_32k"]

BATCH_SIZE = 64
"""The post's batch size."""
DATASET_SIZE = 19_200
"""Samples in the made-up dataset: 300 batches of 64."""
VOCAB = 1024
"""The post's vocabulary."""
PAD_ID = 0
"""Padding token id (labels are -100 there)."""


def tiny_llama() -> tuple[Any, Any, list[int]]:
    """``(model, make_batch, lengths)``: a Llama decoder (2 layers, hidden 64, vocab 1024,
    ``use_cache=False``); ``make_batch(step)`` draws 64 samples of the post's length mix, padded to
    the longest rounded up to 8, with ``attention_mask`` and ``labels``."""
    return _llama(VOCAB, BATCH_SIZE)


def tiny_llama_32k() -> tuple[Any, Any, list[int]]:
    """:func:`tiny_llama` with Llama 2's 32,000-token vocabulary and batches of 16: the LM head and
    the loss are most of a step, as in real models (the captioner's 1024 tokens cannot show it)."""
    return _llama(32_000, 16)


def _llama(vocab: int, batch_size: int) -> tuple[Any, Any, list[int]]:
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=vocab,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=256,
        use_cache=False,
        attention_dropout=0.0,
        pad_token_id=PAD_ID,
        bos_token_id=1,
        eos_token_id=2,
    )
    model = LlamaForCausalLM(config)
    lengths = caption_length_mix(DATASET_SIZE)

    def make_batch(step: int) -> dict[str, Any]:
        chosen = random.Random(step).sample(lengths, batch_size)
        width = -(-max(chosen) // 8) * 8
        generator = torch.Generator().manual_seed(step)
        ids = torch.randint(3, vocab, (batch_size, width), generator=generator)
        mask = (torch.arange(width) < torch.tensor(chosen).unsqueeze(1)).long()
        ids = ids * mask + PAD_ID * (1 - mask)
        labels = ids.masked_fill(mask == 0, -100)
        return {"input_ids": ids, "attention_mask": mask, "labels": labels}

    return model, make_batch, lengths


def captioner_tiny() -> tuple[Any, Any]:
    """``(model, make_batch)``: the bench's tiny captioner; ``make_batch(step)`` is its ``step``-th
    batch."""
    sizes = PRESETS["tiny"]
    model = build_captioner(sizes)
    spec = ModelSpec(source="captioner:tiny", model=model, make_batch=None)
    stream = batch_stream(RECIPES["eager-longest"], spec, sizes, "cpu")[0]
    made: list[dict[str, Any]] = []

    def make_batch(step: int) -> dict[str, Any]:
        while len(made) <= step:
            made.append(next(stream))
        return made[step]

    return model, make_batch
