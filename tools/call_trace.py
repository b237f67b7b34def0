"""How often one call of an entry point goes back into a package file it already entered.

    python tools/call_trace.py compile_regional     # a tiny GPT-2, backend="eager"
    python tools/call_trace.py compile_optimizer    # AdamW over a Linear, backend="eager"

Every distinct call site inside torchcompile_kit is counted once (a loop over blocks once, as a
reader following the code would), in the order the call first reaches it (``sys.setprofile``;
frames of torch or transformers in between are looked through to the package's caller). A call
from one package file into another file that the trace entered before is a return to a file it
already left. Prints that count per file and the file sequence. Run from the repository root
(it imports ``tests/tiny_models.py``); measures the tree on ``sys.path``.
"""

from __future__ import annotations

import collections
import os
import sys
import warnings
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

import torch

import torchcompile_kit
from torchcompile_kit import compile_optimizer, compile_regional

ROOT = os.path.dirname(torchcompile_kit.__file__)


def trace(call: Any) -> tuple[list[str], list[str]]:
    """``call()`` under the profiler: the file sequence and the callee files, one per call site."""
    seen: set[tuple[Any, int, Any]] = set()
    files: list[str] = []
    callees: list[str] = []

    def name(code: Any) -> str:
        return os.path.relpath(code.co_filename, ROOT)

    def enter(file: str) -> None:
        if not files or files[-1] != file:
            files.append(file)

    def profile(frame: Any, event: str, arg: Any) -> None:
        if event != "call" or not frame.f_code.co_filename.startswith(ROOT):
            return
        caller = frame.f_back
        while caller is not None and not caller.f_code.co_filename.startswith(ROOT):
            caller = caller.f_back
        if caller is None:
            enter(name(frame.f_code))
            return
        site = (caller.f_code, caller.f_lineno, frame.f_code)
        if site in seen:
            return
        seen.add(site)
        enter(name(caller.f_code))
        enter(name(frame.f_code))
        if name(caller.f_code) != name(frame.f_code):
            callees.append(name(frame.f_code))

    sys.setprofile(profile)
    try:
        call()
    finally:
        sys.setprofile(None)
    return files, callees


def main(entry: str) -> None:
    warnings.simplefilter("ignore")
    if entry == "compile_optimizer":
        optimizer = torch.optim.AdamW(torch.nn.Linear(4, 4).parameters())
        files, callees = trace(lambda: compile_optimizer(optimizer, backend="eager"))
    else:
        import tiny_models

        model = tiny_models.gpt2()
        files, callees = trace(lambda: compile_regional(model, backend="eager"))
    entered, again = {files[0]}, collections.Counter()
    for file in callees:
        if file in entered:
            again[file] += 1
        entered.add(file)
    print(f"{entry}: {sum(again.values())} calls into a file already entered", dict(again))
    print(" -> ".join(files))


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "compile_regional")
