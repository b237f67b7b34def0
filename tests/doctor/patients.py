"""The doctor's patients: small models with a planted problem in one submodule, builders in the
``bench --model`` contract, and backends that compile a wrong graph (or kill the process) when
the graph holds one op, so that only the module holding it goes wrong."""

from __future__ import annotations

import os
import signal

import torch
from torch import nn
from torch._dynamo.backends.common import aot_autograd
from torch._functorch.aot_autograd import make_boxed_func

WIDTH = 16


class Gate(nn.Module):
    """The only module with a sigmoid."""

    def __init__(self) -> None:
        super().__init__()
        self.proj = nn.Linear(WIDTH, WIDTH)

    def forward(self, x):
        return x * torch.sigmoid(self.proj(x))


class Block(nn.Module):
    def __init__(self, gated: bool) -> None:
        super().__init__()
        self.mix = nn.Linear(WIDTH, WIDTH)
        self.act = nn.GELU()
        self.gate = Gate() if gated else nn.Identity()

    def forward(self, x):
        return x + self.gate(self.act(self.mix(x)))


class Patient(nn.Module):
    """An embedding, three blocks (the last with the gate) and a head; returns the loss."""

    def __init__(self, relu_head: bool = False, blocks: int = 3) -> None:
        super().__init__()
        self.embed = nn.Linear(8, WIDTH)
        self.blocks = nn.ModuleList([Block(gated=i == blocks - 1) for i in range(blocks)])
        self.head = nn.Sequential(
            nn.Linear(WIDTH, WIDTH), nn.ReLU() if relu_head else nn.Tanh(), nn.Linear(WIDTH, 1)
        )

    def forward(self, x, y):
        h = self.embed(x)
        for block in self.blocks:
            h = block(h)
        return {"loss": nn.functional.mse_loss(self.head(h).squeeze(-1), y)}


def make_batch(step: int) -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(step)
    rows = 6 + 2 * step  # a second shape at step 1: the triage's recompile check
    return {"x": torch.randn(rows, 8, generator=gen), "y": torch.randn(rows, generator=gen)}


class ChattyBlock(Block):
    """A block that prints: a graph break, and nothing wrong."""

    def forward(self, x):
        print("block")  # THE_BREAK
        return super().forward(x)


def build():
    return Patient(), make_batch


def build_chatty():
    model = Patient()
    model.blocks[0] = ChattyBlock(gated=False)
    return model, make_batch


def build_relu_head():
    """The head holds the model's only ReLU (inductor's planted relu bugs land there); one block,
    so that each inductor trial compiles less C++."""
    return Patient(relu_head=True, blocks=1), make_batch


# --- backends that go wrong where the graph holds a sigmoid -------------------------------------


def _holds_sigmoid(gm: torch.fx.GraphModule) -> bool:
    return any("sigmoid" in str(node.target) for node in gm.graph.nodes)


def _shifted(gm: torch.fx.GraphModule, example_inputs):
    if not _holds_sigmoid(gm):
        return make_boxed_func(gm)

    def run(*args):
        out = gm(*args)
        shift = lambda t: t + 1e-2 if isinstance(t, torch.Tensor) and t.is_floating_point() else t
        return type(out)(shift(t) for t in out) if isinstance(out, (tuple, list)) else shift(out)

    return make_boxed_func(run)


def _exact(gm: torch.fx.GraphModule, example_inputs):
    return make_boxed_func(gm)


def _dies(gm: torch.fx.GraphModule, example_inputs):
    if _holds_sigmoid(gm):
        os.kill(os.getpid(), signal.SIGFPE)  # what a real integer-division kernel does
    return make_boxed_func(gm)


wrong_sigmoid_grads = aot_autograd(fw_compiler=_exact, bw_compiler=_shifted)
"""The backward graph of a sigmoid is wrong: gradients differ, the forward does not."""
crashes_on_sigmoid = aot_autograd(fw_compiler=_dies, bw_compiler=_exact)
"""Compiling a forward graph with a sigmoid kills the process with SIGFPE."""
