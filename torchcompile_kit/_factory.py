"""A user's factory named by a string, ``"module:function"`` or ``"path/to/file.py:function"``:
how ``bench``/``tune`` (``--model``) and a background compile's worker rebuild a model in another
process. Imports nothing of the package."""

from __future__ import annotations

import importlib
import importlib.machinery
import importlib.util
import os
import sys
from pathlib import Path
from typing import Any

__all__ = ["check_factory", "import_factory", "parse_factory"]


def _named(flag: str, text: str) -> str:
    """``--model 'x:y'`` for a CLI flag, ``factory='x:y'`` for an argument (``flag`` ends in =)."""
    return f"{flag}{text!r}" if flag.endswith("=") else f"{flag} {text!r}"


def parse_factory(
    text: str, *, error: type[Exception] = ValueError, flag: str = "--model"
) -> tuple[str, str]:
    """``"module:function"`` as ``(module, function)``, or ``error`` saying what to pass.

    Example:
        >>> parse_factory("mypkg.models:build")
        ('mypkg.models', 'build')
    """
    module, sep, function = str(text).rpartition(":")
    if not sep or not module or not function or not function.isidentifier():
        raise error(
            f"{_named(flag, text)} is not 'module:function'; pass e.g. mypkg.models:build "
            "(a module importable from the current directory) or path/to/file.py:build"
        )
    return module, function


def check_factory(text: str, *, error: type[Exception] = ValueError, flag: str = "--model") -> None:
    """Refuse now, without importing it, a factory whose file or top-level module cannot be found
    (its import runs later, in another process, where a typo would surface only then).

    Example:
        >>> check_factory("json:loads")
    """
    module, _ = parse_factory(text, error=error, flag=flag)
    if module.endswith(".py") or os.sep in module or "/" in module:
        if not Path(module).is_file():
            raise error(f"{_named(flag, text)}: file {module!r} does not exist")
        return
    top = module.split(".")[0]
    if top in sys.modules or importlib.util.find_spec(top) is not None:
        return
    if importlib.machinery.PathFinder.find_spec(top, [os.getcwd()]) is None:  # `python -m`'s path
        raise error(
            f"{_named(flag, text)}: no module {top!r} is importable here (sys.path and the "
            "current directory); run from the directory that contains it, or pass a path: "
            "path/to/file.py:build"
        )


def import_factory(text: str, *, error: type[Exception] = ValueError, flag: str = "--model") -> Any:
    """The function ``text`` names, imported (a ``.py`` path is loaded as a file; a module from
    the current directory, as ``python -m`` would), or ``error`` saying what failed."""
    module_name, function_name = parse_factory(text, error=error, flag=flag)
    try:
        module = _import(module_name, error)
    except error:
        raise
    except Exception as err:  # any import-time failure is the user's module's
        raise error(
            f"{_named(flag, text)}: importing {module_name!r} failed with "
            f"{type(err).__name__}: {err}. Run from the directory that contains it, or "
            "pass a path: path/file.py:fn"
        ) from err
    function = getattr(module, function_name, None)
    if not callable(function):
        raise error(
            f"{_named(flag, text)}: module {module_name!r} has no callable {function_name!r}"
        )
    return function


def _import(module: str, error: type[Exception]) -> Any:
    if module.endswith(".py") or os.sep in module or "/" in module:
        path = Path(module)
        if not path.is_file():
            raise error(f"file {str(path)!r} does not exist")
        name = f"_tck_user_model_{abs(hash(str(path.resolve())))}"
        spec = importlib.util.spec_from_file_location(name, path)
        loaded = importlib.util.module_from_spec(spec)
        sys.modules[name] = loaded
        spec.loader.exec_module(loaded)
        return loaded
    if "" not in sys.path and os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())  # what `python -m` would do; console scripts do not
    return importlib.import_module(module)
