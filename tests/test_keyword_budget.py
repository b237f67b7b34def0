"""Every public entry point takes at most five keywords of its own (issue 44).

An entry point is a function or a class to construct in ``torchcompile_kit.__all__`` or a topic
folder's ``__all__`` (records, enums and errors are data, not entry points). Its own keywords are
its parameters after the subject (the first positional one: the model, the lengths ...) that have a
default or are keyword-only; ``**compile_kwargs`` are ``torch.compile``'s, not the entry point's.
"""

from __future__ import annotations

import dataclasses
import enum
import importlib
import inspect
import pkgutil
from collections.abc import Callable

import torchcompile_kit

BUDGET = 5


def own_keywords(entry: Callable) -> list[str]:
    function = entry.__init__ if inspect.isclass(entry) else entry
    parameters = [p for p in inspect.signature(function).parameters.values() if p.name != "self"]
    if parameters and parameters[0].kind in (
        inspect.Parameter.POSITIONAL_ONLY,
        inspect.Parameter.POSITIONAL_OR_KEYWORD,
    ):
        parameters = parameters[1:]  # the subject
    return [
        p.name
        for p in parameters
        if p.kind not in (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD)
        and (p.default is not inspect.Parameter.empty or p.kind is inspect.Parameter.KEYWORD_ONLY)
    ]


def is_entry_point(value: object) -> bool:
    if inspect.isclass(value):
        data = dataclasses.is_dataclass(value) or hasattr(value, "_fields")
        return not data and not issubclass(value, (enum.Enum, BaseException))
    return inspect.isfunction(value)


def entry_points() -> dict[str, Callable]:
    modules = [torchcompile_kit] + [
        importlib.import_module(f"torchcompile_kit.{info.name}")
        for info in pkgutil.iter_modules(torchcompile_kit.__path__)
        if info.ispkg and not info.name.startswith("_")
    ]
    found: dict[str, Callable] = {}
    for module in modules:
        for name in module.__all__:
            value = getattr(module, name)
            if is_entry_point(value) and value not in found.values():
                found[f"{module.__name__}.{name}"] = value
    return found


def test_every_entry_point_takes_at_most_five_keywords_of_its_own():
    entries = entry_points()
    # the listing covers the recipes, the checks, the shapes helpers, tune and the doctor
    for name in (
        "torchcompile_kit.compile_regional",
        "torchcompile_kit.check_compile_equivalence",
        "torchcompile_kit.BucketBatchSampler",
        "torchcompile_kit.tune",
        "torchcompile_kit.doctor.diagnose",
        "torchcompile_kit.bench.run_recipe_isolated",
    ):
        assert name in entries
    assert len(entries) > 60
    over = {n: own_keywords(e) for n, e in entries.items() if len(own_keywords(e)) > BUDGET}
    assert not over, f"over the budget of {BUDGET} keywords: {over}"


def test_a_sixth_keyword_is_counted_and_refused():
    def six(model, *, a=1, b=2, c=3, d=4, e=5, f=6, **compile_kwargs):
        pass

    class Built:
        def __init__(self, lengths, buckets, batch_size, *, a=1, b=2, c=3, d=4, e=5):
            pass

    assert own_keywords(six) == ["a", "b", "c", "d", "e", "f"]
    assert len(own_keywords(six)) > BUDGET  # what the budget test refuses
    assert own_keywords(Built) == ["a", "b", "c", "d", "e"]  # required positionals are not options
    assert is_entry_point(Built) and not is_entry_point(dataclasses.make_dataclass("R", ["x"]))
