"""A fresh process for the compile-cache tests: one inductor train step, cache saved or loaded.

Run as ``python cache_worker.py MODE ARGS...`` with ``TORCHINDUCTOR_CACHE_DIR`` set by the test;
prints one JSON line. Modes:

- ``cold OUT``: compile + one step, then ``save_compile_cache(OUT)``.
- ``warm IN``: ``load_compile_cache(IN)``, one step, the hit counters; then a ``memory://`` round
  trip in the same process (memory:// lives in one process).
- ``dist IN SHARED RESULT_DIR``: 2 ranks (gloo, 127.0.0.1, one spawn). Rank 0 loads IN and steps
  on 8 rows; rank 1 steps on 12 rows (its own graphs, as a GPU rank's are its device index's);
  both call ``save_compile_cache(SHARED)`` (each writes its own artifact); then both ranks load
  SHARED into their own empty inductor dir and step as before; each writes
  ``RESULT_DIR/rank<r>.json``.
"""

from __future__ import annotations

import json
import os
import sys

import torch


class MLP(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.up = torch.nn.Linear(16, 32)
        self.down = torch.nn.Linear(32, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down(torch.nn.functional.gelu(self.up(x)))


def train_step(batch: int = 8) -> float:
    """One compiled forward + backward of a seeded MLP on ``batch`` seeded rows; the loss."""
    torch.manual_seed(0)
    model = MLP()
    model.compile(backend="inductor")
    x = torch.randn(batch, 16)
    loss = model(x).pow(2).mean()
    loss.backward()
    return float(loss.detach())


ISA_CHECKS: list[str] = []  # inductor's CPU-ISA test libraries this process built or loaded


def _count_isa_checks() -> None:
    from torch._inductor import cpu_vec_isa

    real = cpu_vec_isa.VecISA.check_build

    def check_build(self, code):
        ISA_CHECKS.append(str(self))
        return real(self, code)

    cpu_vec_isa.VecISA.check_build = check_build


def counters() -> dict[str, int]:
    from torchcompile_kit import _dynamo

    return _dynamo.compile_cache_counters()


def cold(out: str) -> dict:
    import torchcompile_kit as tck

    _count_isa_checks()
    loss = train_step()
    saved = tck.save_compile_cache(out)
    return {
        "loss": loss,
        "isa_checks": len(ISA_CHECKS),
        "counters": counters(),
        "saved": bool(saved),
        "entries": saved.mega_cache_entries,
        "kernel_files": saved.kernel_files,
    }


def warm(src: str) -> dict:
    import torchcompile_kit as tck
    from torchcompile_kit import _dynamo

    _count_isa_checks()
    with tck.compile_cache(src, save_on_exit=False) as cache:
        loss = train_step()  # compiles at once: dynamo's start callback waits for the probe
        probe_finished = _dynamo.wait_for_cpu_isa_probe(timeout=0)
    loaded = cache.loaded
    result = {
        "loss": loss,
        "loaded": bool(loaded),
        "reason": loaded.reason,
        "signature": loaded.signature,
        "entries": loaded.mega_cache_entries,
        "kernel_files": loaded.kernel_files,
        "stats": loaded.cache_stats() if loaded else counters(),
        "session_stats": cache.cache_stats(),
        "isa_probe_started": loaded.cpu_isa_probe_started,
        "isa_probe_finished": probe_finished,
        "isa_probe": _dynamo.cpu_isa_probe_stats(),
        "isa_checks": len(ISA_CHECKS),
    }
    memory_saved = tck.save_compile_cache("memory://tck-test/cc.tck")
    memory_loaded = tck.load_compile_cache("memory://tck-test/cc.tck")
    result["memory"] = {
        "saved": bool(memory_saved),
        "loaded": bool(memory_loaded),
        "entries": memory_loaded.mega_cache_entries,
        "reason": memory_loaded.reason,
    }
    return result


def _dist_rank(rank: int, src: str, shared: str, result_dir: str, port: int) -> None:
    import torch.distributed as dist

    import torchcompile_kit as tck

    os.environ["TORCHINDUCTOR_CACHE_DIR"] = os.path.join(result_dir, f"inductor-a{rank}")
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    try:
        rows = 8 + 4 * rank  # rank 1's graphs are not rank 0's
        if rank == 0:
            tck.load_compile_cache(src)
        train_step(rows)
        saved = tck.save_compile_cache(shared)  # collective: each rank writes its own, all wait
        # Every rank reads, into an empty inductor dir of its own (a fresh machine's view).
        os.environ["TORCHINDUCTOR_CACHE_DIR"] = os.path.join(result_dir, f"inductor-b{rank}")
        torch._dynamo.reset()
        before = counters()
        loaded = tck.load_compile_cache(shared)
        loss = train_step(rows)
        after = counters()
        result = {
            "rank": rank,
            "saved": bool(saved),
            "saved_path": saved.path,
            "save_reason": saved.reason,
            "loaded": bool(loaded),
            "loaded_path": loaded.path,
            "load_reason": loaded.reason,
            "loss": loss,
            "kernel_files": loaded.kernel_files,
            "stats": {k: after[k] - before.get(k, 0) for k in after},
        }
        with open(os.path.join(result_dir, f"rank{rank}.json"), "w") as handle:
            json.dump(result, handle)
        dist.barrier()
    finally:
        dist.destroy_process_group()


def dist_main(src: str, shared: str, result_dir: str) -> dict:
    import torch.multiprocessing as mp

    from tests.integrations.spawn import free_port  # the repo is on PYTHONPATH (run_worker)

    mp.spawn(_dist_rank, args=(src, shared, result_dir, free_port()), nprocs=2, join=True)
    return {"ok": True}


if __name__ == "__main__":
    mode, *args = sys.argv[1:]
    handler = {"cold": cold, "warm": warm, "dist": dist_main}[mode]
    print(json.dumps(handler(*args)))
