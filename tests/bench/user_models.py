"""Model factories for ``--model`` tests: tiny, fast, and some deliberately wrong."""

from __future__ import annotations

import torch
from torch import nn

VOCAB = 32


class TinyLM(nn.Module):
    """Embedding + linear head; returns the loss itself (the contract allows it)."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(VOCAB, 16)
        self.head = nn.Linear(16, VOCAB)

    def forward(self, input_ids, labels):
        logits = self.head(self.embed(input_ids))
        return nn.functional.cross_entropy(logits.flatten(0, 1), labels.flatten())


def make_batch(step: int) -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(step)
    ids = torch.randint(0, VOCAB, (4, 12), generator=gen)
    return {"input_ids": ids, "labels": ids}


class _Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.mix = nn.Linear(16, 16)

    def forward(self, x):
        return x + nn.functional.gelu(self.mix(x))


class TinyBlocksLM(TinyLM):
    """TinyLM with two repeated blocks between embedding and head (for compile_regional)."""

    def __init__(self) -> None:
        super().__init__()
        self.blocks = nn.ModuleList([_Block() for _ in range(2)])

    def forward(self, input_ids, labels):
        x = self.embed(input_ids)
        for block in self.blocks:
            x = block(x)
        logits = self.head(x)
        return nn.functional.cross_entropy(logits.flatten(0, 1), labels.flatten())


def tiny_blocks_lm():
    torch.manual_seed(0)
    return TinyBlocksLM(), make_batch


def tiny_lm():
    torch.manual_seed(0)
    return TinyLM(), make_batch


def tiny_lm_with_lengths():
    torch.manual_seed(0)
    return TinyLM(), make_batch, [12] * 64


class _CompileHostile(TinyLM):
    def forward(self, input_ids, labels):
        if torch.compiler.is_compiling():
            raise RuntimeError("this model refuses to be compiled")
        return super().forward(input_ids, labels)


def compile_hostile():
    """Runs eagerly, raises under torch.compile: compiled recipes fail, eager ones do not."""
    torch.manual_seed(0)
    return _CompileHostile(), make_batch


def returns_model_only():
    return TinyLM()


def make_batch_not_a_dict():
    return TinyLM(), lambda step: [1, 2, 3]


def raises():
    raise OSError("weights not found")


class MediumLM(nn.Module):
    """An MLP LM whose training step takes milliseconds on a CPU (the paired-timing tests)."""

    def __init__(self, width: int = 128) -> None:
        super().__init__()
        self.embed = nn.Embedding(VOCAB, width)
        self.mlp = nn.Sequential(
            nn.Linear(width, 4 * width), nn.GELU(), nn.Linear(4 * width, width)
        )
        self.head = nn.Linear(width, VOCAB)

    def forward(self, input_ids, labels):
        hidden = self.embed(input_ids)
        logits = self.head(hidden + self.mlp(hidden))
        return nn.functional.cross_entropy(logits.flatten(0, 1), labels.flatten())


def make_medium_batch(step: int) -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(step)
    ids = torch.randint(0, VOCAB, (8, 32), generator=gen)
    return {"input_ids": ids, "labels": ids}


def medium_lm():
    torch.manual_seed(0)
    return MediumLM(), make_medium_batch


def tiny_lm_noting_its_temp_dir():
    """``tiny_lm`` that writes the temp dir its process got to the file ``$TCK_TEST_NOTE`` names."""
    import os
    import tempfile

    with open(os.environ["TCK_TEST_NOTE"], "w") as note:
        note.write(tempfile.gettempdir())
    return tiny_lm()
