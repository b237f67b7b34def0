"""``--model`` factories for trying ``tune`` (and the bench) without a model of your own.

- :func:`tiny_llama`: a tiny Llama-style decoder (transformers ``LlamaForCausalLM``, random
  weights from a config) on the post's caption-length mix (90% in [5,31], 9% in [33,63], 1% in
  [65,255]), batches of 64 padded to their longest (a multiple of 8), and the dataset's lengths
  as the optional third item::

      torchcompile-kit tune --model torchcompile_kit.tuning.examples:tiny_llama --steps-planned 2000

- :func:`tiny_llama_32k`: the same decoder with Llama's 32,000-token vocabulary, where the LM head
  and the loss are most of a step (what compiling the loss and the remainder are measured on)::

      torchcompile-kit bench eager regional-blocks regional regional-remainder --model torchcompile_kit.tuning.examples:tiny_llama_32k

- :func:`captioner_tiny`: the bench's tiny captioner with captions padded to their longest, as a
  factory (the snippet ``tune`` writes for the built-in captioner imports it).

Nothing downloads; the data is made in code and the same for a given step in every process.
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
    """A tiny Llama-style decoder, its batches and the dataset's lengths (the ``--model`` contract).

    Returns:
        ``(model, make_batch, lengths)``: 2 layers, hidden 64, 4 heads (2 KV heads), vocab 1024,
        256 positions, ``use_cache=False``; ``make_batch(step)`` draws 64 samples of the post's
        length mix (the same for the same step), pads them to the longest rounded up to 8, with
        ``attention_mask`` and ``labels`` (-100 on padding).

    Example:
        >>> model, make_batch, lengths = tiny_llama()  # doctest: +SKIP
        >>> model(**make_batch(0)).loss  # doctest: +SKIP
    """
    return _llama(VOCAB, BATCH_SIZE)


def tiny_llama_32k() -> tuple[Any, Any, list[int]]:
    """:func:`tiny_llama` with a 32,000-token vocabulary and batches of 16 (the ``--model`` contract).

    The vocabulary of Llama 2: at hidden 64 the LM head and the cross-entropy over 32,000 logits
    per token are most of a step, as they are a large share of one for real models with 32k–50k
    vocabularies; the bench's captioner (vocab 1024) cannot show what compiling them is worth.

    Returns:
        ``(model, make_batch, lengths)`` as :func:`tiny_llama`, 16 samples per batch.

    Example:
        >>> model, make_batch, lengths = tiny_llama_32k()  # doctest: +SKIP
        >>> model.config.vocab_size  # doctest: +SKIP
        32000
    """
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
    """The bench's tiny captioner and its batches (captions padded to their longest).

    Returns:
        ``(model, make_batch)``; ``make_batch(step)`` is the bench's ``step``-th batch.

    Example:
        >>> model, make_batch = captioner_tiny()  # doctest: +SKIP
    """
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
