"""Tiny random-weight transformers models built from configs (nothing loaded from a hub).

Every builder returns a model in train mode with dropout disabled, so eager and compiled runs are
deterministic and comparable.
"""

from __future__ import annotations

import torch

VOCAB = 128


def _no_dropout(config, *names: str):
    for name in names:
        if hasattr(config, name):
            setattr(config, name, 0.0)
    return config


def gpt2(n_layer: int = 2, n_embd: int = 32, **overrides):
    from transformers import GPT2Config, GPT2LMHeadModel

    config = GPT2Config(
        vocab_size=VOCAB,
        n_positions=128,
        n_embd=n_embd,
        n_layer=n_layer,
        n_head=4,
        bos_token_id=1,
        eos_token_id=2,
        **overrides,
    )
    _no_dropout(config, "resid_pdrop", "embd_pdrop", "attn_pdrop")
    return GPT2LMHeadModel(config)


def llama(n_layer: int = 2, hidden: int = 32, **overrides):
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        vocab_size=VOCAB,
        hidden_size=hidden,
        intermediate_size=2 * hidden,
        num_hidden_layers=n_layer,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=128,
        **overrides,
    )
    return LlamaForCausalLM(config)


def bert(n_layer: int = 2, hidden: int = 32):
    from transformers import BertConfig, BertForMaskedLM

    config = BertConfig(
        vocab_size=VOCAB,
        hidden_size=hidden,
        num_hidden_layers=n_layer,
        num_attention_heads=4,
        intermediate_size=2 * hidden,
        max_position_embeddings=128,
    )
    _no_dropout(config, "hidden_dropout_prob", "attention_probs_dropout_prob")
    return BertForMaskedLM(config)


def t5(n_layer: int = 2, d_model: int = 32):
    from transformers import T5Config, T5ForConditionalGeneration

    config = T5Config(
        vocab_size=VOCAB,
        d_model=d_model,
        d_kv=8,
        d_ff=2 * d_model,
        num_layers=n_layer,
        num_decoder_layers=n_layer,
        num_heads=4,
        dropout_rate=0.0,
        decoder_start_token_id=0,
    )
    return T5ForConditionalGeneration(config)


def vit_config(n_layer: int = 2, hidden: int = 32):
    from transformers import ViTConfig

    config = ViTConfig(
        image_size=32,
        patch_size=8,
        num_channels=3,
        hidden_size=hidden,
        num_hidden_layers=n_layer,
        num_attention_heads=4,
        intermediate_size=2 * hidden,
    )
    return _no_dropout(config, "hidden_dropout_prob", "attention_probs_dropout_prob")


def vit(n_layer: int = 2, hidden: int = 32):
    from transformers import ViTModel

    return ViTModel(vit_config(n_layer, hidden), add_pooling_layer=False)


def vision_encoder_decoder(n_layer: int = 2, hidden: int = 32):
    """The post's captioning model, tiny: ViT encoder + GPT-2 decoder."""
    from transformers import GPT2Config, VisionEncoderDecoderConfig, VisionEncoderDecoderModel

    decoder = GPT2Config(
        vocab_size=VOCAB,
        n_positions=128,
        n_embd=hidden,
        n_layer=n_layer,
        n_head=4,
        bos_token_id=1,
        eos_token_id=2,
    )
    _no_dropout(decoder, "resid_pdrop", "embd_pdrop", "attn_pdrop")
    config = VisionEncoderDecoderConfig.from_encoder_decoder_configs(
        vit_config(n_layer, hidden), decoder
    )
    config.decoder_start_token_id = 1
    config.pad_token_id = 0
    return VisionEncoderDecoderModel(config=config)


def opt(n_layer: int = 2, hidden: int = 32, **overrides):
    """OPT uses nn.Linear projections (LoKr/LoHa/OFT reject GPT-2's Conv1D)."""
    from transformers import OPTConfig, OPTForCausalLM

    config = OPTConfig(
        vocab_size=VOCAB,
        hidden_size=hidden,
        num_hidden_layers=n_layer,
        ffn_dim=2 * hidden,
        num_attention_heads=4,
        max_position_embeddings=128,
        word_embed_proj_dim=hidden,
        dropout=0.0,
        attention_dropout=0.0,
        **overrides,
    )
    return OPTForCausalLM(config)


def token_batch(batch: int = 2, length: int = 16, *, seed: int = 0) -> dict[str, torch.Tensor]:
    """A causal-LM batch of random token ids with labels."""
    gen = torch.Generator().manual_seed(seed)
    ids = torch.randint(3, VOCAB, (batch, length), generator=gen)
    return {"input_ids": ids, "attention_mask": torch.ones_like(ids), "labels": ids.clone()}


# --- models whose layers alternate attention kinds (sliding window vs full) -------------------


def gemma2(n_layer: int = 4, hidden: int = 32):
    from transformers import Gemma2Config, Gemma2ForCausalLM

    config = Gemma2Config(
        vocab_size=VOCAB,
        hidden_size=hidden,
        intermediate_size=2 * hidden,
        num_hidden_layers=n_layer,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=8,
        sliding_window=8,
        attention_dropout=0.0,
    )
    return Gemma2ForCausalLM(config)


def qwen2_sliding(n_layer: int = 4, hidden: int = 32):
    from transformers import Qwen2Config, Qwen2ForCausalLM

    config = Qwen2Config(
        vocab_size=VOCAB,
        hidden_size=hidden,
        intermediate_size=2 * hidden,
        num_hidden_layers=n_layer,
        num_attention_heads=4,
        num_key_value_heads=2,
        use_sliding_window=True,
        sliding_window=8,
        max_window_layers=n_layer // 2,
        attention_dropout=0.0,
    )
    return Qwen2ForCausalLM(config)


def gpt_neo(n_layer: int = 4, hidden: int = 32):
    from transformers import GPTNeoConfig, GPTNeoForCausalLM

    config = GPTNeoConfig(
        vocab_size=VOCAB,
        hidden_size=hidden,
        num_layers=n_layer,
        num_heads=4,
        attention_types=[[["global", "local"], n_layer // 2]],
        window_size=8,
        max_position_embeddings=64,
        bos_token_id=1,
        eos_token_id=2,
    )
    _no_dropout(config, "attention_dropout", "embed_dropout", "resid_dropout")
    return GPTNeoForCausalLM(config)


def cohere2(n_layer: int = 4, hidden: int = 32):
    from transformers import Cohere2Config, Cohere2ForCausalLM

    config = Cohere2Config(
        vocab_size=VOCAB,
        hidden_size=hidden,
        intermediate_size=2 * hidden,
        num_hidden_layers=n_layer,
        num_attention_heads=4,
        num_key_value_heads=2,
        sliding_window=8,
        sliding_window_pattern=2,
        bos_token_id=1,
        eos_token_id=2,
        pad_token_id=0,
        attention_dropout=0.0,
    )
    return Cohere2ForCausalLM(config)


def roberta(n_layer: int = 2, hidden: int = 32):
    """Of the BERT family: a block whose ``forward`` only calls submodules."""
    from transformers import RobertaConfig, RobertaForMaskedLM

    config = RobertaConfig(
        vocab_size=VOCAB,
        hidden_size=hidden,
        num_hidden_layers=n_layer,
        num_attention_heads=4,
        intermediate_size=2 * hidden,
        max_position_embeddings=128,
        pad_token_id=0,
    )
    _no_dropout(config, "hidden_dropout_prob", "attention_probs_dropout_prob")
    return RobertaForMaskedLM(config)
