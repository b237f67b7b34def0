"""Run a test body on 2 CPU ranks (gloo on 127.0.0.1), and tear the process group down after.

A spawn costs ~20-30 s (mostly importing torch/transformers twice), so each multi-process test
runs several variants in one spawn. A failing assertion in a rank re-raises in the parent
(``torch.multiprocessing.ProcessRaisedException`` with the rank's traceback).
"""

from __future__ import annotations

import os
import socket
import sys
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

WORLD = 2


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def run_on_ranks(body: Callable[..., None], *args: Any, init_process_group: bool = True) -> None:
    """``body(rank, world, *args)`` in ``WORLD`` processes, each with the rendezvous env set.

    With ``init_process_group=False`` the body initializes it itself (accelerate's
    ``Accelerator()`` does, from the env); it is destroyed after ``body`` either way.
    """
    mp.spawn(_entry, args=(body, free_port(), init_process_group, args), nprocs=WORLD, join=True)


def _entry(rank: int, body, port: int, init_process_group: bool, args: tuple) -> None:
    os.environ.update(
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(port),
        RANK=str(rank),
        LOCAL_RANK=str(rank),
        WORLD_SIZE=str(WORLD),
        LOCAL_WORLD_SIZE=str(WORLD),
        OMP_NUM_THREADS="1",
    )
    torch.set_num_threads(1)
    if init_process_group:
        dist.init_process_group("gloo", rank=rank, world_size=WORLD)
    try:
        body(rank, WORLD, *args)
        if dist.is_initialized():
            dist.barrier()  # no rank tears gloo down while the other still talks to it
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()
    # A passing rank ends here, without interpreter finalization: gloo's worker threads can
    # still hold work whose teardown aborts the process at exit ("terminate called without an
    # active exception", SIGABRT; seen once on torch 2.10 after the body had passed; upstream:
    # https://github.com/pytorch/pytorch/pull/179291). A failing body raised above, as before.
    sys.stdout.flush(), sys.stderr.flush()
    os._exit(0)
