"""The doctor's patients: small models with a planted problem in one submodule, builders in the
``bench --model`` contract, and a backend that compiles a wrong backward graph when
the graph holds one op, so that only the module holding it goes wrong (real bugs of torch:
``real_bugs.py``)."""

from __future__ import annotations

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

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Linear(8, WIDTH)
        self.blocks = nn.ModuleList([Block(gated=i == 2) for i in range(3)])
        self.head = nn.Sequential(nn.Linear(WIDTH, WIDTH), nn.Tanh(), nn.Linear(WIDTH, 1))

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


class BranchingBlock(Block):
    """A block that prints and branches on a ``.item()``: two graph breaks, nothing wrong."""

    def forward(self, x):
        print("block", x.shape)  # THE_PRINT
        h = super().forward(x)
        if h.mean().item() > 0:  # THE_BRANCH
            h = h * 0.5
        return h


def build():
    return Patient(), make_batch


class NarrowingBlock(Block):
    """A branch on a ``.item()`` that narrows ``h`` to one column, then code that reads its
    width: ``torch.where`` broadcasts it back, so the rewrite changes what eager computes."""

    def forward(self, x):
        h = super().forward(x)
        if h.mean().item() > -1e9:  # THE_NARROWING
            h = h.mean(dim=-1, keepdim=True)
        return h.expand(-1, WIDTH) / h.shape[-1]


def build_narrowing():
    model = Patient()
    model.blocks[1] = NarrowingBlock(gated=False)
    return model, make_batch


def build_branching():
    model = Patient()
    model.blocks[1] = BranchingBlock(gated=False)
    return model, make_batch


def build_chatty():
    model = Patient()
    model.blocks[0] = ChattyBlock(gated=False)
    return model, make_batch


class CountingPatient(Patient):
    """The loss summed and divided by a token count the batch carries as a Python int, as a
    training loop passes ``num_items_in_batch``: a guard on a value that changes per batch."""

    def forward(self, x, y, tokens):
        loss = nn.functional.mse_loss(super().forward(x, y)["loss"], y.new_zeros(()))
        return {"loss": loss * x.shape[0] / tokens}


def make_counted_batch(step: int) -> dict[str, object]:
    """The same shapes at every step, and a token count that changes."""
    return {**make_batch(0), "tokens": 6 + step}


def build_counting():
    return CountingPatient(), make_counted_batch


class ReluMLP(nn.Module):
    """Two linear layers with the model's only ReLU between them (``head.1``), and the loss."""

    def __init__(self) -> None:
        super().__init__()
        self.head = nn.Sequential(nn.Linear(8, WIDTH), nn.ReLU(), nn.Linear(WIDTH, 1))

    def forward(self, x, y):
        return {"loss": nn.functional.mse_loss(self.head(x).squeeze(-1), y)}


def build_relu_mlp():
    """The smallest patient for planted ReLU bugs (each inductor trial compiles little C++)."""
    return ReluMLP(), make_batch


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


def hangs(gm: torch.fx.GraphModule, example_inputs):
    """A backend that never returns from compiling a graph with a sigmoid (a hung compile)."""
    if _holds_sigmoid(gm):
        import time

        time.sleep(3600)
    return gm


wrong_sigmoid_grads = aot_autograd(fw_compiler=_exact, bw_compiler=_shifted)
"""The backward graph of a sigmoid is wrong: gradients differ, the forward does not."""


# --- controls: nothing is wrong, and the doctor must say so --------------------------------------


class RandomPatient(Patient):
    """Dropout as a module and as a function (``training=self.training``: the comparator cannot
    turn it off), trained on non-contiguous inputs."""

    def __init__(self) -> None:
        super().__init__()
        self.drop = nn.Dropout(0.2)

    def forward(self, x, y):
        h = self.drop(self.embed(x))
        for block in self.blocks:
            h = nn.functional.dropout(block(h), 0.2, training=self.training)
        return {"loss": nn.functional.mse_loss(self.head(h).squeeze(-1), y)}


def make_strided_batch(step: int) -> dict[str, torch.Tensor]:
    batch = make_batch(step)
    return {"x": batch["x"].t().contiguous().t(), "y": batch["y"]}  # column-major rows


def build_random_strided():
    return RandomPatient(), make_strided_batch


def build_lora():
    """A PEFT LoRA on the blocks' mixing layers (for the doctor's ``peft`` recipe)."""
    from peft import LoraConfig, get_peft_model

    return get_peft_model(Patient(), LoraConfig(r=4, target_modules=["mix"])), make_batch


def gpt2(layers: int = 2, width: int = 32, activation: str = "gelu_new", rows: int = 2):
    """A GPT-2 built from its config (vocabulary 128), and batches of token ids (16 long, a
    second length at step 1)."""
    from transformers import GPT2Config, GPT2LMHeadModel

    config = GPT2Config(
        n_layer=layers,
        n_embd=width,
        n_head=width // 16,
        vocab_size=128,
        n_positions=64,
        activation_function=activation,
        bos_token_id=0,
        eos_token_id=0,
    )

    def make_batch(step: int) -> dict[str, torch.Tensor]:
        gen = torch.Generator().manual_seed(step)
        ids = torch.randint(0, 128, (rows, 16 + 8 * step), generator=gen)
        return {"input_ids": ids, "labels": ids}

    return GPT2LMHeadModel(config), make_batch


def build_gpt2():
    """A one-layer GPT-2: the healthy transformers control."""
    return gpt2(layers=1)


def trial_inputs(folder, builder: str = "build") -> dict[str, str]:
    """What the doctor's trial runner gives every trial, for a builder of this module: its model's
    weights and its first batch, saved in ``folder``."""
    model, make = globals()[builder]()
    torch.save(model.state_dict(), folder / "state.pt")
    torch.save(make(0), folder / "batch.pt")
    return {
        "spec": f"tests.doctor.patients:{builder}",
        "state": str(folder / "state.pt"),
        "batch": str(folder / "batch.pt"),
    }
