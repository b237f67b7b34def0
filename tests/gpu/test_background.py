"""A background compile on CUDA: the worker compiles on the training GPU after checking its free
memory, and training switches to the worker's precompiled blocks."""

from __future__ import annotations

import sys
import textwrap
import time

import torch
from regional.test_background import MODEL  # the CPU tests' factory module

from torchcompile_kit import uncompile
from torchcompile_kit.regional import (
    BackgroundCompile,
    BackgroundState,
    compile_in_background,
    get_background_compile,
)


def test_training_switches_to_the_workers_blocks_on_the_gpu(device, tmp_path, monkeypatch):
    (tmp_path / "tck_bg_model.py").write_text(textwrap.dedent(MODEL))
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.chdir(tmp_path)  # the worker imports the factory from the training process's cwd
    import tck_bg_model

    try:
        model = tck_bg_model.build().to(device)
        compile_in_background(
            model, worker=BackgroundCompile(factory="tck_bg_model:build", start_after_s=0)
        )
        opt = torch.optim.SGD(model.parameters(), lr=0.01)
        record, started = get_background_compile(model), time.perf_counter()
        while (
            record.state in (BackgroundState.WAITING, BackgroundState.COMPILING)
            and time.perf_counter() - started < 300
        ):
            x = torch.randn(32, 16, generator=torch.Generator().manual_seed(record.eager_steps)).to(
                device
            )
            model(x).backward()
            opt.step()
            opt.zero_grad()
            time.sleep(0.01)
        model(torch.randn(32, 16).to(device)).backward()  # the first compiled call
        print("background:", record.summary(), record.gpu_memory)
        assert record.state is BackgroundState.COMPILED, record.summary()
        assert record.device == str(next(model.parameters()).device)
        assert (record.gpu_memory is not None) == (device.type == "cuda")
        assert record.worker_check == "passed"
    finally:
        uncompile(model)
        sys.modules.pop("tck_bg_model", None)
