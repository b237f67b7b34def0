"""The reference post's toy model and data: an image captioner (ViT encoder + GPT-2 decoder) on
captions of variable length, built from configs with random weights and data made in code.

The post (Chaim Rand, "Maximizing AI/ML Model Performance with PyTorch Compilation", Towards Data
Science, 2025, https://towardsdatascience.com/maximizing-ai-ml-model-performance-with-pytorch-compilation/)
trains default ``ViTConfig`` + ``GPT2Config`` (vocab 1024) on captions whose lengths are 90% in
[5,31], 9% in [33,63], 1% in [65,255], batch 64, Adam. ``full-size`` keeps those sizes; ``tiny``
fits a bench run in minutes on a 2-core CPU. Dropout is 0 in both, so eager and compiled losses
compare.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Any

__all__ = ["PRESETS", "CaptionerPreset", "build_captioner", "caption_length_mix", "caption_samples"]

PAD_ID = 0
START_ID = 1
END_ID = 2


@dataclass(kw_only=True, slots=True, frozen=True)
class CaptionerPreset:
    """Sizes of the captioner and of the run."""

    name: str
    """``"tiny"`` or ``"full-size"``."""
    image_size: int
    """Side of the square random images (the post: 224)."""
    patch_size: int
    """ViT patch side (the post: 16)."""
    hidden: int
    """Hidden size of both the encoder and the decoder (the post: 768)."""
    layers: int
    """Layers in the encoder and in the decoder each (the post: 12)."""
    heads: int
    """Attention heads (the post: 12)."""
    vocab: int
    """Decoder vocabulary (the post: 1024)."""
    max_length: int
    """Longest caption, the pad-to-max length (the post: 256)."""
    batch_size: int
    """Samples per step (the post: 64)."""
    warmup_steps: int
    """Steps timed as warm-up from a cold start (the post: 20)."""
    steps: int
    """Steady steps timed after warm-up (the post: 100)."""
    max_buckets: int
    """``plan_buckets(max_buckets=)`` of the bucket recipe (the post's recompile limit: 8)."""


PRESETS: dict[str, CaptionerPreset] = {
    # Small enough that one inductor compile of the whole model takes tens of seconds on 2 cores,
    # and steady steps take milliseconds; the length mix and max length stay the post's, so the
    # shape and padding behaviour of every recipe is the post's.
    "tiny": CaptionerPreset(
        name="tiny",
        image_size=32,
        patch_size=8,
        hidden=64,
        layers=2,
        heads=2,
        vocab=1024,
        max_length=256,
        batch_size=8,
        warmup_steps=5,
        steps=20,
        max_buckets=4,
    ),
    "full-size": CaptionerPreset(
        name="full-size",
        image_size=224,
        patch_size=16,
        hidden=768,
        layers=12,
        heads=12,
        vocab=1024,
        max_length=256,
        batch_size=64,
        warmup_steps=20,
        steps=100,
        max_buckets=8,
    ),
}


def caption_length_mix(n: int, *, seed: int = 0, max_length: int = 256) -> list[int]:
    """``n`` caption lengths from the post's mix: 90% U[5,31], 9% U[33,63], 1% U[65,max_length-1].

    Example:
        >>> len(caption_length_mix(10))
        10
    """
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        u = rng.random()
        low, high = (5, 31) if u < 0.9 else (33, 63) if u < 0.99 else (65, max_length - 1)
        out.append(rng.randint(low, high))
    return out


def build_captioner(preset: CaptionerPreset, *, seed: int = 0) -> Any:
    """The post's ``VisionEncoderDecoderModel`` at ``preset``'s sizes, in train mode, with weights
    drawn from ``seed`` (every recipe starts from the same weights), ``use_cache=False``, dropout
    0."""
    import torch
    from transformers import (
        GPT2Config,
        VisionEncoderDecoderConfig,
        VisionEncoderDecoderModel,
        ViTConfig,
    )

    encoder = ViTConfig(
        hidden_size=preset.hidden,
        num_hidden_layers=preset.layers,
        num_attention_heads=preset.heads,
        intermediate_size=4 * preset.hidden,
        image_size=preset.image_size,
        patch_size=preset.patch_size,
        hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0,
    )
    decoder = GPT2Config(
        vocab_size=preset.vocab,
        n_positions=preset.max_length,
        n_embd=preset.hidden,
        n_layer=preset.layers,
        n_head=preset.heads,
        resid_pdrop=0.0,
        embd_pdrop=0.0,
        attn_pdrop=0.0,
        bos_token_id=START_ID,
        eos_token_id=END_ID,
        use_cache=False,
    )
    config = VisionEncoderDecoderConfig.from_encoder_decoder_configs(encoder, decoder)
    config.decoder.use_cache = False
    config.decoder_start_token_id = START_ID
    config.pad_token_id = PAD_ID
    config.eos_token_id = END_ID
    torch.manual_seed(seed)
    model = VisionEncoderDecoderModel(config=config)
    model.encoder.pooler = None  # unused; its parameters would get no gradient
    return model.train()


def caption_samples(preset: CaptionerPreset, n: int, *, seed: int = 0) -> list[dict[str, Any]]:
    """``n`` samples like the post's ``FakeDataset``: ``pixel_values``, ``decoder_input_ids`` (START
    + caption), ``decoder_attention_mask`` and ``labels`` (caption + END), of one length drawn from
    :func:`caption_length_mix`, so any collator gives the post's batches."""
    import torch

    lengths = caption_length_mix(n, seed=seed, max_length=preset.max_length)
    gen = torch.Generator().manual_seed(seed)
    samples = []
    for length in lengths:
        caption = torch.randint(3, preset.vocab, (length - 1,), generator=gen)
        labels = torch.cat([caption, torch.tensor([END_ID])])
        inputs = torch.cat([torch.tensor([START_ID]), caption])
        image = torch.randn(3, preset.image_size, preset.image_size, generator=gen)
        samples.append(
            {
                "pixel_values": image,
                "decoder_input_ids": inputs,
                "decoder_attention_mask": torch.ones(length, dtype=torch.long),
                "labels": labels,
            }
        )
    return samples
