"""`import torchcompile_kit` stays cheap and free of side effects."""

from __future__ import annotations

import json
import subprocess
import sys

import torchcompile_kit

_PROBE = r"""
import json, sys
before = set(sys.modules)
import torchcompile_kit
heavy = sorted(m for m in set(sys.modules) - before
               if m.split('.')[0] in {'torch', 'transformers', 'peft', 'accelerate'})
import torch
import torch._dynamo.config as dc, torch._inductor.config as ic
snap = lambda: (json.dumps(dc.get_config_copy(), default=repr, sort_keys=True),
                json.dumps(ic.get_config_copy(), default=repr, sort_keys=True))
fresh = snap()
# touching every public name loads every module; none may change a setting
for name in torchcompile_kit.__all__:
    getattr(torchcompile_kit, name)
optional = sorted({m.split('.')[0] for m in sys.modules} & {'transformers', 'peft', 'accelerate'})
print(json.dumps({"heavy": heavy, "config_changed": snap() != fresh, "optional": optional}))
"""


def _probe() -> dict:
    out = subprocess.run(
        [sys.executable, "-c", _PROBE], capture_output=True, text=True, check=True, timeout=300
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_import_is_cheap_and_side_effect_free():
    result = _probe()
    assert result["heavy"] == [], f"import torchcompile_kit imported {result['heavy']}"
    assert result["optional"] == [], f"public API imported optional deps {result['optional']}"
    assert result["config_changed"] is False


def test_all_is_sorted_public_and_resolves():
    names = torchcompile_kit.__all__
    assert names == sorted(names)
    assert not [n for n in names if n.startswith("_") and n != "__version__"]
    for name in names:
        assert getattr(torchcompile_kit, name) is not None
    assert set(names) <= set(dir(torchcompile_kit))


def test_unknown_attribute_raises_attribute_error():
    try:
        torchcompile_kit.does_not_exist  # noqa: B018
    except AttributeError as err:
        assert "does_not_exist" in str(err)
    else:
        raise AssertionError("expected AttributeError")


def test_a_topics_name_at_the_top_says_where_it_is():
    import pytest

    with pytest.raises(
        AttributeError, match="from torchcompile_kit.errors import UnsafeAdapterConfigError"
    ):
        torchcompile_kit.UnsafeAdapterConfigError  # noqa: B018
    with pytest.raises(
        AttributeError, match="from torchcompile_kit.regional import find_repeated_blocks"
    ):
        torchcompile_kit.find_repeated_blocks  # noqa: B018


def test_every_public_name_has_its_reason_in_the_architecture_page():
    import re
    from pathlib import Path

    page = (Path(__file__).parents[1] / "docs" / "architecture.md").read_text()
    table = page[page.index("## The public face") :].split("\n\n")[2]
    listed = {
        name for row in table.splitlines()[2:] for name in re.findall(r"`(\w+)`", row.split("|")[1])
    }
    assert listed == set(torchcompile_kit.__all__) - {"__version__"}


def test_every_error_a_topic_exports_is_a_torchcompilekiterror():
    """One base error: ``except TorchCompileKitError`` catches every refusal of the library."""
    import importlib

    from torchcompile_kit.errors import TorchCompileKitError

    found = []
    for topic in (*torchcompile_kit._TOPICS, "bench", "bench.recipes", "bench.results"):
        module = importlib.import_module(f"torchcompile_kit.{topic}")
        for name in module.__all__:
            obj = getattr(module, name)
            if (
                isinstance(obj, type)
                and issubclass(obj, Exception)
                and not issubclass(obj, Warning)
            ):
                found.append(obj)
                assert issubclass(obj, TorchCompileKitError), f"torchcompile_kit.{topic}.{name}"
    assert len(found) >= 12


def test_errors_inherit_builtins():
    from torchcompile_kit import errors

    for name in errors.__all__:
        cls = getattr(errors, name)
        if issubclass(cls, Warning):  # a cache that cannot be used is a warning, not an error
            assert issubclass(cls, UserWarning), name
            continue
        assert issubclass(cls, errors.TorchCompileKitError)
        if cls is not errors.TorchCompileKitError:
            assert issubclass(cls, (ValueError, RuntimeError)), name
