"""Stand-ins for what a documentation page leaves to the reader: ``model``, ``ds``, a saved adapter.

Each is tiny (2-layer models with hidden size 32 from ``tests/tiny_models.py``, a few dozen
samples) and built only when a block names it. :data:`DEFAULTS` serves every page;
:data:`PER_PAGE` overrides a name where a page means something else by it (``model`` is a PEFT
model on docs/peft.md, a ViT + GPT-2 captioner on docs/regional.md). :data:`SETUP` prepares what
a block reaches by path or URL rather than by name (``"path/to/rank16_adapter"``, ``s3://``,
``mypkg.models:build``) and undoes it after the block.
"""

from __future__ import annotations

import functools
import sys
import types
from collections.abc import Callable
from pathlib import Path
from typing import Any

import tiny_models as tm
import torch

Factory = Callable[["StandIns"], Any]


class StandIns:
    """The stand-ins of one block: each built on first use, from the page's factories."""

    def __init__(self, page: str, workdir: Path, namespace: dict[str, Any]) -> None:
        self.page = page
        self.workdir = workdir
        self.namespace = namespace  # the block's: the tour's functions read `model` from it
        self._built: dict[str, Any] = {}

    def names(self) -> set[str]:
        return {*DEFAULTS, *PER_PAGE.get(self.page, {})}

    def __getitem__(self, name: str) -> Any:
        if name not in self._built:
            factory = PER_PAGE.get(self.page, {}).get(name) or DEFAULTS[name]
            self._built[name] = factory(self)
        return self._built[name]


# --- data --------------------------------------------------------------------------------------


def _lengths(_: StandIns) -> list[int]:
    generator = torch.Generator().manual_seed(0)
    return torch.randint(4, 31, (48,), generator=generator).tolist()


def _rows(s: StandIns) -> list[dict[str, list[int]]]:
    return [
        {"input_ids": [3 + i % 100 for i in range(n)], "labels": [3 + i % 100 for i in range(n)]}
        for n in s["lengths"]
    ]


def _tokenizer(_: StandIns) -> Any:
    """A real (fast) tokenizer, built in code: a word-level vocabulary with a pad token."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {"[PAD]": 0, "[UNK]": 1, **{f"w{i}": i for i in range(2, tm.VOCAB)}}
    tokenizer = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    return PreTrainedTokenizerFast(tokenizer_object=tokenizer, pad_token="[PAD]", unk_token="[UNK]")


def _batches(_: StandIns) -> list[dict[str, torch.Tensor]]:
    """A loader's worth of causal-LM batches (3 steps of 2 x 16 tokens)."""
    return [tm.token_batch(seed=step) for step in range(3)]


def _collate(s: StandIns) -> Any:
    from torchcompile_kit import PadToBucketCollator

    return PadToBucketCollator(buckets=s["buckets"])


def _sampler(s: StandIns) -> Any:
    from torchcompile_kit import BucketBatchSampler

    return BucketBatchSampler(s["lengths"], s["buckets"], batch_size=8)


def _bucket_loader(s: StandIns) -> Any:
    from torch.utils.data import DataLoader

    return DataLoader(s["dataset"], batch_sampler=s["sampler"], collate_fn=s["collate"])


# --- models and steps --------------------------------------------------------------------------


def _llama(_: StandIns) -> torch.nn.Module:
    torch.manual_seed(0)
    return tm.llama()


def _gpt2(_: StandIns) -> torch.nn.Module:
    torch.manual_seed(0)
    return tm.gpt2()


def _train_step(s: StandIns) -> Callable[[dict[str, torch.Tensor]], torch.Tensor]:
    """A compiled forward + backward (backend eager: compiles in seconds)."""
    model = _gpt2(s)
    compiled = torch.compile(model, backend="eager")

    def train_step(batch: dict[str, torch.Tensor]) -> torch.Tensor:
        loss = compiled(**batch).loss
        loss.backward()
        model.zero_grad(set_to_none=True)
        return loss

    return train_step


def _adamw(s: StandIns) -> torch.optim.Optimizer:
    return torch.optim.AdamW(s["model"].parameters(), lr=1e-3)


def _forward_backward(s: StandIns) -> Callable[[dict[str, torch.Tensor]], torch.Tensor]:
    """The tour's warm-up step: forward + backward of the block's ``model`` (no optimizer step)."""
    names = s.namespace

    def forward_backward(batch):
        loss = names["model"](**batch).loss
        loss.backward()
        return loss

    return forward_backward


class _OneBatchPerBucket:
    """One collated batch per shape of the block's ``loader`` (docs/shapes.md's recipe)."""

    def __init__(self, names: dict[str, Any]) -> None:
        self.names = names

    def __iter__(self):
        loader, ds = self.names["loader"], self.names["ds"]
        return (
            loader.collate_fn([ds[i] for i in idx]) for idx in loader.batch_sampler.warmup_indices()
        )


def _train(_: StandIns) -> Callable[..., None]:
    """The reader's training loop: forward, backward, optimizer step, for every batch."""

    def train(model, loader, optimizer):
        for batch in loader:
            model(**batch).loss.backward()
            optimizer.step()
            optimizer.zero_grad()

    return train


# --- docs/optimizer.md: foreach_map_adam_step's lists --------------------------------------------


def _adam_lists(s: StandIns) -> dict[str, list[torch.Tensor]]:
    generator = torch.Generator().manual_seed(0)
    shapes = [(4, 8), (8,), (3, 3)]
    return {
        "params": [torch.randn(shape, generator=generator) for shape in shapes],
        "grads": [torch.randn(shape, generator=generator) for shape in shapes],
        "exp_avgs": [torch.zeros(shape) for shape in shapes],
        "exp_avg_sqs": [torch.zeros(shape) for shape in shapes],
        "steps": [torch.tensor(0.0) for _ in shapes],
    }


def _adam_list(s: StandIns, *, name: str) -> list[torch.Tensor]:
    return s["adam_lists"][name]


# --- docs/peft.md --------------------------------------------------------------------------------


def _peft_model(_: StandIns) -> torch.nn.Module:
    """LoRA on GPT-2 with the two adapters the page's examples name: 'default' and 'other'."""
    from peft import LoraConfig, get_peft_model

    torch.manual_seed(0)
    model = get_peft_model(tm.gpt2(), LoraConfig(r=8, target_modules=["c_attn"]))
    model.add_adapter("other", LoraConfig(r=8, target_modules=["c_attn"]))
    return model


def _rank16_adapter(workdir: Path) -> Callable[[], None]:
    """A saved rank-16 LoRA adapter at the path docs/peft.md hotswaps in."""
    from peft import LoraConfig, get_peft_model

    torch.manual_seed(1)
    get_peft_model(tm.gpt2(), LoraConfig(r=16, target_modules=["c_attn"])).save_pretrained(
        workdir / "path" / "to" / "rank16_adapter"
    )
    return lambda: None  # in the block's scratch directory: removed with it


def _memory_s3(_: Path) -> Callable[[], None]:
    """``s3://`` served by fsspec's in-memory filesystem: the page's URL, no bucket, no network."""
    import fsspec
    from fsspec.implementations.memory import MemoryFileSystem

    registry = sys.modules["fsspec.registry"]  # the module (fsspec.registry is its mapping)
    before = registry.registry.get("s3")
    fsspec.register_implementation("s3", MemoryFileSystem, clobber=True)

    def undo() -> None:
        MemoryFileSystem.store.clear()
        MemoryFileSystem.pseudo_dirs[:] = [""]
        if before is None:
            registry._registry.pop("s3", None)
        else:
            fsspec.register_implementation("s3", before, clobber=True)

    return undo


def _mypkg(_: Path) -> Callable[[], None]:
    """``mypkg.models:build`` as docs/benchmarks.md describes it: ``build() -> (model,
    make_batch)``."""

    def build():
        model = tm.gpt2()

        def make_batch(step):
            return tm.token_batch(seed=step)

        return model, make_batch

    package = types.ModuleType("mypkg")
    models = types.ModuleType("mypkg.models")
    models.build = build
    package.models = models
    sys.modules.update({"mypkg": package, "mypkg.models": models})

    def undo() -> None:
        for name in ("mypkg", "mypkg.models"):
            sys.modules.pop(name, None)

    return undo


# (page, text the block contains) -> set up before the block; returns the undo
SETUP: dict[tuple[str, str], Callable[[Path], Callable[[], None]]] = {
    ("docs/peft.md", "path/to/rank16_adapter"): _rank16_adapter,
    ("docs/cache.md", "s3://"): _memory_s3,
    ("docs/tune.md", "mypkg.models"): _mypkg,
}


DEFAULTS: dict[str, Factory] = {
    "lengths": _lengths,
    "dataset": _rows,
    "ds": _rows,
    "rows": _rows,
    "train_ds": _rows,
    "eval_rows": _rows,
    "buckets": lambda _: [8, 16, 32],
    "tok": _tokenizer,
    "tokenizer": _tokenizer,
    "collate": _collate,
    "sampler": _sampler,
    "loader": _batches,
    "batch": lambda _: tm.token_batch(),
    "train_batch": lambda _: tm.token_batch(seed=1),
    "epochs": lambda _: 2,
    "model": _llama,
    "optimizer": _adamw,
    "opt": _adamw,
    "train_step": _train_step,
    "log": lambda _: print,  # the reader's training logger
    "args": lambda s: __import__("transformers").TrainingArguments(
        output_dir=str(s.workdir / "out"),
        per_device_train_batch_size=8,
        report_to=[],
        use_cpu=True,
    ),
    "forward_backward": _forward_backward,
    "one_batch_per_bucket": lambda s: _OneBatchPerBucket(s.namespace),
    "train": _train,
}

PER_PAGE: dict[str, dict[str, Factory]] = {
    "README.md": {  # "12 x GPT2Block": a 2-layer one here; enough rows for batches of 64
        "model": _gpt2,
        "lengths": lambda _: torch.randint(
            4, 31, (1024,), generator=torch.Generator().manual_seed(0)
        ).tolist(),
    },
    "docs/regional.md": {
        "model": lambda _: tm.vision_encoder_decoder(),  # the page's encoder / decoder patterns
        "gpt2": lambda _: tm.gpt2(n_layer=12),  # find_repeated_blocks only: nothing compiles
        "vit_gpt2": lambda _: tm.vision_encoder_decoder(),
    },
    "docs/diagnostics.md": {"model": _gpt2},
    # a batch of 64, one bucket: the example runs one real step (its sampler used to yield none)
    "docs/index.md": {"lengths": lambda _: [12] * 64},
    "docs/shapes.md": {
        "loader": _bucket_loader,
        "buckets": lambda _: [8, 16, 24, 32, 48, 64, 152, 256],  # the page's own example
    },
    "docs/peft.md": {
        "model": _peft_model,
        "base": _gpt2,
    },
    "docs/optimizer.md": {
        **{
            name: functools.partial(_adam_list, name=name)
            for name in ("params", "grads", "exp_avgs", "exp_avg_sqs", "steps")
        },
        "adam_lists": _adam_lists,
    },
}
