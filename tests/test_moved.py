"""Upgrades that say what changed: every public keyword removed or renamed since the API was first
published (commit bbc03ef) is refused by name with what to pass now (``torchcompile_kit/_moved.py``,
one table), and a keyword removed from now on cannot go without an entry there.

``public_keywords.json`` holds every keyword each public entry point has taken: the union of the
signatures at bbc03ef and today's. A keyword added to an entry point is added there too (the last
test says which), so that its later removal is caught.
"""

from __future__ import annotations

import inspect
import json
import re
from pathlib import Path

import pytest
import torch
from test_keyword_budget import entry_points

from torchcompile_kit._moved import MOVED, REMOVED

EVER_TAKEN: dict[str, list[str]] = json.loads(
    (Path(__file__).with_name("public_keywords.json")).read_text()
)
ENTRIES = {entry.__name__: entry for entry in entry_points().values()}


def keywords_now(entry) -> set[str]:
    """The entry's own keywords, and torch.compile's where it passes ``**compile_kwargs`` on."""
    function = entry.__init__ if inspect.isclass(entry) else entry
    parameters = inspect.signature(function).parameters.values()
    own = {
        p.name
        for p in parameters
        if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY) and p.name != "self"
    }
    if any(p.kind is p.VAR_KEYWORD and p.name == "compile_kwargs" for p in parameters):
        own |= set(inspect.signature(torch.compile).parameters)
    return own


@pytest.mark.parametrize(
    ("name", "keyword"), [(name, keyword) for name, table in MOVED.items() for keyword in table]
)
def test_a_removed_keyword_is_refused_by_name_with_its_replacement(name, keyword):
    """The public object itself refuses it, before reading any other argument (none is passed:
    a bare TypeError about a missing argument would fail the match)."""
    with pytest.raises(TypeError) as raised:
        ENTRIES[name](**{keyword: None})
    assert str(raised.value) == f"{name}({keyword}=...) was removed: {MOVED[name][keyword]}"


def test_the_replacements_name_what_to_pass():
    assert re.search(r"batching=Batching\(batch_size=", MOVED["plan_buckets"]["batch_size"])
    assert "seed=None" in MOVED["BucketBatchSampler"]["shuffle"]
    assert "pad_token_id=tokenizer.pad_token_id" in MOVED["PadToBucketCollator"]["tokenizer"]
    assert "betas=(beta1, beta2)" in MOVED["foreach_map_adam_step"]["beta1"]
    assert "save_result(result, out_dir)" in MOVED["tune"]["out_dir"]


def test_every_keyword_ever_taken_is_taken_now_or_refused_with_its_replacement():
    missing = {
        name: sorted(set(taken) - keywords_now(ENTRIES[name]) - set(MOVED.get(name, {})))
        for name, taken in EVER_TAKEN.items()
        if name in ENTRIES
    }
    missing = {name: keywords for name, keywords in missing.items() if keywords}
    assert not missing, (
        f"removed without an entry in torchcompile_kit/_moved.py (and CHANGELOG.md): {missing}"
    )
    gone = sorted(set(EVER_TAKEN) - set(ENTRIES) - set(REMOVED))
    assert gone == [], f"public entry points removed without an entry in _moved.REMOVED: {gone}"


def test_every_keyword_taken_now_is_recorded():
    compile_keywords = set(inspect.signature(torch.compile).parameters)
    unrecorded = {
        name: sorted(keywords_now(entry) - compile_keywords - set(EVER_TAKEN.get(name, [])))
        for name, entry in ENTRIES.items()
    }
    unrecorded = {name: keywords for name, keywords in unrecorded.items() if keywords}
    assert not unrecorded, f"add to tests/public_keywords.json: {unrecorded}"
