"""docs/index.md's tour, as written, trains like eager and compiles nothing after its warm-up.

The tour's block runs on data that exercises what the recipe must survive (lengths past 64, so
past the rotary cache of the tiny Llama, and more samples than fill the buckets, so a tail
batch exists unless ``drop_last`` drops it). Its first 3 optimizer steps are compared with an
eager model and a plain ``torch.optim.Adam`` on the same batches.
"""

from __future__ import annotations

import copy
import re
from pathlib import Path

import pytest
import tiny_models as tm
import torch

ROOT = Path(__file__).resolve().parents[2]
STEPS = 3


def _tour_source() -> str:
    text = (ROOT / "docs" / "index.md").read_text()
    step3 = text.index("**3. Apply what paid off.**")
    start = text.index("```python\n", step3) + len("```python\n")
    return text[start : text.index("\n```", start)]


def _rows(lengths):
    return [
        {"input_ids": [3 + i % 100 for i in range(n)], "labels": [3 + i % 100 for i in range(n)]}
        for n in lengths
    ]


def _run_tour(tmp_path, monkeypatch, *, backend: str | None):
    monkeypatch.chdir(tmp_path)
    source = _tour_source()
    if backend is not None:  # the same block, compiled with a faster backend
        source = source.replace(
            "compile_regional(model, ", f"compile_regional(model, backend={backend!r}, "
        )
        source = re.sub(r"(lr=torch\.tensor\(1e-4\)\))\)", rf"\1, backend={backend!r})", source)
        assert source.count(f"backend={backend!r}") == 2, source
    torch.manual_seed(0)
    model = tm.llama()
    reference = copy.deepcopy(model)
    lengths = torch.randint(4, 121, (700,), generator=torch.Generator().manual_seed(0)).tolist()
    seen: list[dict[str, torch.Tensor]] = []
    losses: list[float] = []

    def train(model, loader, optimizer):
        for batch in loader:
            seen.append(batch)
            loss = model(**batch).loss
            losses.append(loss.item())
            loss.backward()
            optimizer.step()
            optimizer.zero_grad()
            if len(seen) == STEPS:
                return

    namespace = {"model": model, "lengths": lengths, "ds": _rows(lengths), "train": train}
    exec(  # the reader's own warm-up step and batches, as the tour describes them  # noqa: S102
        "def forward_backward(batch):\n"
        "    loss = model(**batch).loss\n"
        "    loss.backward()\n"
        "    return loss\n"
        "class _OneBatchPerBucket:\n"
        "    def __iter__(self):\n"
        "        return (loader.collate_fn([ds[i] for i in idx])\n"
        "                for idx in loader.batch_sampler.warmup_indices())\n"
        "one_batch_per_bucket = _OneBatchPerBucket()\n",
        namespace,
    )
    exec(compile(source, "docs/index.md", "exec"), namespace)  # noqa: S102
    assert len(seen) == STEPS
    assert max(b["input_ids"].shape[1] for b in namespace["one_batch_per_bucket"]) > 64

    optimizer = torch.optim.Adam(reference.parameters(), lr=1e-4)
    for batch, loss in zip(seen, losses):
        expected = reference(**batch).loss
        assert loss == pytest.approx(expected.item(), rel=1e-4, abs=1e-5)
        expected.backward()
        optimizer.step()
        optimizer.zero_grad()
    for (name, p), q in zip(namespace["model"].named_parameters(), reference.parameters()):
        torch.testing.assert_close(p, q, rtol=1e-4, atol=1e-5, msg=name)
    monitor = namespace["mon"]
    assert monitor.limit_hits == [], monitor.summary()


@pytest.mark.slow
def test_tour_trains_like_eager_and_compiles_nothing_after_warmup(tmp_path, monkeypatch):
    _run_tour(tmp_path, monkeypatch, backend="aot_eager")


@pytest.mark.slow
def test_tour_as_written_with_inductor(tmp_path, monkeypatch):
    _run_tour(tmp_path, monkeypatch, backend=None)
