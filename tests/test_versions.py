"""The declared version window is the tested one: pyproject.toml, .ci/run and README.md agree."""

from __future__ import annotations

import re
from pathlib import Path

import tomllib
from packaging.requirements import Requirement
from packaging.version import Version

ROOT = Path(__file__).resolve().parents[1]


def _ci_setting(name: str) -> str:
    match = re.search(
        rf"^{name}=\"?([^\"\n]+)\"?$", (ROOT / ".ci" / "run").read_text(), re.MULTILINE
    )
    assert match, f".ci/run sets no {name}"
    return match[1]


def _declared_floors() -> dict[str, Version]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    requirements = [*project["dependencies"], *project["optional-dependencies"]["test"]]
    floors = {}
    for text in requirements:
        req = Requirement(text)
        for spec in req.specifier:
            if spec.operator == ">=":
                floors[req.name] = Version(spec.version)
    return floors


def test_ci_floor_run_installs_exactly_the_declared_floors():
    floors = _declared_floors()
    assert Version(_ci_setting("FLOOR_TORCH")) == floors["torch"]
    pinned = dict(pin.split("==") for pin in _ci_setting("FLOOR_LIBS").split())
    assert {name: Version(v) for name, v in pinned.items()} == {
        name: floors[name] for name in ("transformers", "peft", "accelerate")
    }


def test_readme_installs_the_torch_ci_tests_and_names_the_window():
    readme = (ROOT / "README.md").read_text()
    readme_torch = _ci_setting("README_TORCH")
    assert re.findall(r"pip install torch==([\d.]+)", readme) and set(
        re.findall(r"pip install torch==([\d.]+)", readme)
    ) == {readme_torch}
    floor, newest = _ci_setting("FLOOR_TORCH"), _ci_setting("NEWEST_TORCH")
    assert Version(floor) <= Version(readme_torch) <= Version(newest)
    for version in (floor, readme_torch, newest):
        assert version in readme, f"README.md does not name the tested torch {version}"


def test_the_changelog_names_the_version_being_released():
    """A public API change raises the version, and CHANGELOG.md says what changed in it."""
    import torchcompile_kit

    version = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    assert torchcompile_kit.__version__ == version
    changelog = (ROOT / "CHANGELOG.md").read_text()
    newest = re.search(r"^## \[(\d+\.\d+\.\d+)\] - \d{4}-\d{2}-\d{2}$", changelog, re.MULTILINE)
    assert newest and newest[1] == version, "the newest CHANGELOG.md entry is not the version"
