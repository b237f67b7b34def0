"""Which of the monitor's frames belong to a model, module class, optimizer or function
(``CompileMonitor.attribute`` and ``record_for``)."""

from __future__ import annotations

import inspect
import os
from collections.abc import Callable, Iterable
from typing import Any

import torch
from torch import nn

from .trace_records import RESUME_PREFIX

__all__ = ["classes_of", "frame_selector"]


def classes_of(targets: Iterable[nn.Module | type]) -> list[type]:
    """The classes of ``targets``: each class itself, or every submodule's class of a model."""
    classes: dict[type, None] = {}
    for target in targets:
        if isinstance(target, type):
            classes.setdefault(target, None)
        else:
            for module in target.modules():
                classes.setdefault(type(module), None)
    return list(classes)


def frame_selector(target: Any) -> Callable[[str, str | None, int | None, str | None], bool]:
    """``keep(function, file, line, owner)``: whether a frame (or event) belongs to ``target``.

    A model or module class: its classes' names as the frame's ``owner`` (call
    ``CompileMonitor.attribute`` first). An optimizer: ``torch/optim`` and its class's file. A
    function: its code and the code resumed after its graph breaks.
    """
    if isinstance(target, torch.optim.Optimizer):
        optim_dir = os.path.dirname(torch.optim.__file__) + os.sep
        class_file = inspect.getfile(type(target))
        return lambda fn, file, line, owner: (
            bool(file) and (file.startswith(optim_dir) or file == class_file)
        )
    if isinstance(target, (nn.Module, type)):
        names = {cls.__name__ for cls in classes_of([target])}
        return lambda fn, file, line, owner: owner in names
    code = getattr(inspect.unwrap(target), "__code__", None)
    if code is None:
        raise TypeError(
            "record_for expects a module, module class, optimizer or Python "
            f"function; got {type(target).__name__!r}"
        )
    last = max((ln for _, _, ln in code.co_lines() if ln), default=code.co_firstlineno)

    def keep(fn: str, file: str | None, line: int | None, owner: str | None) -> bool:
        if file != code.co_filename or line is None:
            return False
        if fn == code.co_name and line == code.co_firstlineno:
            return True
        return (
            fn.startswith(RESUME_PREFIX + code.co_name + "_at_")
            and code.co_firstlineno <= line <= last
        )

    return keep
