"""``--model`` factories for the tune tests: tiny plain-torch LMs (cheap to import in a child).

Importing this module registers the ``tck_test_perturb`` backend, which runs the graph and then
scales every floating output by 1.01: a compiled variant that is deliberately wrong. Each
candidate's process imports this module again (through the spec), so the backend exists there too.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

VOCAB = 64
BATCH, LENGTH = 4, 16
PERTURB_BACKEND = "tck_test_perturb"


def _perturb(gm, example_inputs):
    def run(*args):
        out = gm(*args)
        scale = lambda t: t * 1.01 if isinstance(t, torch.Tensor) and t.is_floating_point() else t
        if isinstance(out, (tuple, list)):
            return type(out)(scale(t) for t in out)
        return scale(out)

    return run


if PERTURB_BACKEND not in torch._dynamo.list_backends(exclude_tags=()):
    torch._dynamo.register_backend(_perturb, name=PERTURB_BACKEND)


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(32)
        self.up = nn.Linear(32, 64)
        self.down = nn.Linear(64, 32)

    def forward(self, hidden):
        return hidden + self.down(F.gelu(self.up(self.norm(hidden))))


@torch.compiler.disable
def _host_side(hidden):
    """Runs eagerly: a forced graph break in a compiled forward."""
    return hidden


class TinyLM(nn.Module):
    def __init__(self, *, graph_break: bool = False) -> None:
        super().__init__()
        self.graph_break = graph_break
        self.embed = nn.Embedding(VOCAB, 32)
        self.blocks = nn.ModuleList([Block(), Block()])
        self.head = nn.Linear(32, VOCAB)

    def forward(self, input_ids, labels):
        hidden = self.embed(input_ids)
        for block in self.blocks:
            hidden = block(hidden)
            if self.graph_break:
                hidden = _host_side(hidden)
        logits = self.head(hidden)
        return {"loss": F.cross_entropy(logits.flatten(0, 1), labels.flatten()), "logits": logits}


def _make_batch(step: int) -> dict[str, torch.Tensor]:
    generator = torch.Generator().manual_seed(step)
    ids = torch.randint(0, VOCAB, (BATCH, LENGTH), generator=generator)
    return {"input_ids": ids, "labels": ids.roll(-1, dims=1)}


def build():
    torch.manual_seed(0)
    return TinyLM(), _make_batch


def build_with_break():
    torch.manual_seed(0)
    return TinyLM(graph_break=True), _make_batch


def build_with_lengths():
    torch.manual_seed(0)
    return TinyLM(), _make_batch, [5, 9, 12, 16, 16, 3, 7, 11] * 50


def build_with_optimizer():
    """The factory returns its own optimizer (the fourth item), which tune and the snippet keep."""
    torch.manual_seed(0)
    model = TinyLM()
    return (
        model,
        _make_batch,
        None,
        torch.optim.AdamW(model.parameters(), lr=3e-4, weight_decay=0.1),
    )
