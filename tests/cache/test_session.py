"""compile_cache(): load on enter, save after the first steps and on exit."""

from __future__ import annotations

import pytest

import torchcompile_kit as tck
from torchcompile_kit import _dynamo

MEGA = b"compiled graphs " * 100


@pytest.fixture
def fake_compiles(monkeypatch, tmp_path):
    """A growing fake mega-cache: each call of ``compile_more()`` adds a compiled graph."""
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "inductor"))
    state = {"graphs": 0, "loads": 0}

    def save():
        return (MEGA * state["graphs"], {"inductor": state["graphs"]}) if state["graphs"] else None

    def load(data):
        state["loads"] += 1
        return {"inductor": len(data) // len(MEGA)}

    monkeypatch.setattr(_dynamo, "save_mega_cache", save)
    monkeypatch.setattr(_dynamo, "load_mega_cache", load)
    state["compile_more"] = lambda: state.__setitem__("graphs", state["graphs"] + 1)
    return state


def test_saves_after_the_first_steps_and_skips_an_unchanged_save_on_exit(fake_compiles, tmp_path):
    path = tmp_path / "cc.tck"
    with tck.compile_cache(path, save_after=2) as cache:
        assert not cache.loaded and "no artifact" in cache.loaded.reason
        fake_compiles["compile_more"]()
        cache.step()
        assert not path.exists()
        cache.step()
        assert path.exists() and cache.saved and cache.saved.mega_cache_entries == {"inductor": 1}
        cache.step()
    assert cache.saved and "unchanged" in cache.saved.reason
    assert cache.steps == 3

    with tck.compile_cache(path) as second:
        assert second.loaded and second.loaded.mega_cache_entries == {"inductor": 1}
        fake_compiles["compile_more"]()  # a new shape compiled: the exit save rewrites
    assert second.saved and second.saved.reason == ""
    assert tck.load_compile_cache(path).mega_cache_entries == {"inductor": 2}


def test_an_error_in_the_block_still_saves_and_propagates(fake_compiles, tmp_path):
    path = tmp_path / "cc.tck"
    with pytest.raises(KeyError, match="boom"), tck.compile_cache(path, load=False) as cache:
        fake_compiles["compile_more"]()
        raise KeyError("boom")
    assert cache.loaded is None and cache.saved and path.exists()


def test_save_after_must_be_positive(tmp_path):
    with pytest.raises(ValueError, match="save_after"), tck.compile_cache(tmp_path, save_after=0):
        pass


def test_a_url_without_fsspec_fails_on_enter(monkeypatch):
    monkeypatch.setitem(__import__("sys").modules, "fsspec", None)
    with (
        pytest.raises(ImportError, match=r"torchcompile-kit\[remote\]"),
        tck.compile_cache("gs://bucket/cc.tck", load=False),
    ):
        pytest.fail("entered")
