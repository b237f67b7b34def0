"""Signed artifacts: with a key, a compile cache that someone else wrote (or changed and re-hashed,
as anyone with write access can) is refused before anything in it is parsed, written or loaded."""

from __future__ import annotations

import dataclasses
import os
import pickle
import warnings

import pytest

import torchcompile_kit as tck
from torchcompile_kit.cache import ENV_KEY, CompileCacheWarning, signature
from torchcompile_kit.cache.artifact import pack, unpack
from torchcompile_kit.cache.header import current_environment

from .conftest import FAKE_MEGA, run_worker
from .test_api import _kernel_files

KEY, OTHER = "team-key-2026", "someone-elses-key"


@pytest.fixture(autouse=True)
def no_key_from_the_environment(monkeypatch):
    monkeypatch.delenv(ENV_KEY, raising=False)


def _kernel(inductor_dir):
    kernel = inductor_dir / "q6" / "cq6kernel.so"
    kernel.parent.mkdir(parents=True, exist_ok=True)
    kernel.write_bytes(b"\x7fELF compiled kernel")
    return kernel


def _move_to_a_fresh_dir(monkeypatch, tmp_path):
    fresh = tmp_path / "fresh-inductor"
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(fresh))
    return fresh


def _rehashed(data: bytes, **change) -> bytes:
    """What anyone who can write the file can do: change it and recompute its content hash."""
    artifact = unpack(data, current_environment=current_environment())
    parts = {
        "environment": artifact.header["environment"],
        "mega_cache": artifact.mega_cache,
        "kernel_files": artifact.kernel_files,
        "contents": artifact.header["contents"],
        **change,
    }
    return pack(**parts)


# --- the key's round trip ----------------------------------------------------------------------


def test_the_key_that_signed_loads_it_and_says_so(
    fake_mega_cache, tmp_path, inductor_dir, monkeypatch
):
    _kernel(inductor_dir)
    saved = tck.save_compile_cache(tmp_path / "cc.tck", key=KEY)
    assert saved and saved.signed_by == signature.key_id(KEY.encode())
    fresh = _move_to_a_fresh_dir(monkeypatch, tmp_path)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        loaded = tck.load_compile_cache(tmp_path / "cc.tck", key=KEY)
    assert loaded and loaded.signature == f"verified (key {saved.signed_by})"
    assert fake_mega_cache == [FAKE_MEGA] and _kernel_files(fresh) == ["q6/cq6kernel.so"]


@pytest.mark.parametrize("case", ["wrong key", "unsigned", "rehashed", "trailer stripped"])
def test_a_refused_artifact_reaches_neither_inductor_nor_the_unpickler(
    case, fake_mega_cache, tmp_path, inductor_dir, monkeypatch
):
    _kernel(inductor_dir)
    path = tmp_path / "cc.tck"
    tck.save_compile_cache(path, key=None if case == "unsigned" else KEY)
    data = path.read_bytes()
    if case in ("rehashed", "trailer stripped"):
        body, trailer = signature.split(data)
        tampered = _rehashed(body, mega_cache=b"planted " + FAKE_MEGA)
        path.write_bytes(tampered + trailer if case == "rehashed" else tampered)
    fresh = _move_to_a_fresh_dir(monkeypatch, tmp_path)
    with pytest.warns(CompileCacheWarning, match="refused") as warned:
        loaded = tck.load_compile_cache(path, key=OTHER if case == "wrong key" else KEY)
    assert not loaded and loaded.reason.startswith("refused: ")
    assert fake_mega_cache == [] and _kernel_files(fresh) == []  # nothing handed on, nothing placed
    expected = {
        "wrong key": "signed with key",
        "unsigned": "it is not signed",
        "rehashed": "does not match its content",
        "trailer stripped": "it is not signed",
    }[case]
    assert expected in loaded.reason and expected in str(warned[0].message)


def test_without_a_key_a_rehashed_artifact_still_loads(
    fake_mega_cache, tmp_path, inductor_dir, monkeypatch
):
    """Why the key exists: the content hash alone cannot tell a replaced artifact from ours."""
    _kernel(inductor_dir)
    path = tmp_path / "cc.tck"
    tck.save_compile_cache(path)
    path.write_bytes(_rehashed(path.read_bytes(), mega_cache=b"planted " + FAKE_MEGA))
    _move_to_a_fresh_dir(monkeypatch, tmp_path)
    loaded = tck.load_compile_cache(path)
    assert (
        loaded and loaded.signature == "unsigned" and fake_mega_cache == [b"planted " + FAKE_MEGA]
    )


def test_a_signed_artifact_loaded_without_a_key_loads_and_warns_that_it_was_not_checked(
    fake_mega_cache, tmp_path, inductor_dir
):
    saved = tck.save_compile_cache(tmp_path / "cc.tck", key=KEY)
    with pytest.warns(
        CompileCacheWarning, match=rf"signed by key {saved.signed_by}, not checked.*{ENV_KEY}"
    ):
        loaded = tck.load_compile_cache(tmp_path / "cc.tck")
    assert loaded and loaded.signature.startswith("signed by key")


def test_the_environment_variable_signs_checks_and_rotates(
    fake_mega_cache, tmp_path, inductor_dir, monkeypatch
):
    monkeypatch.setenv(ENV_KEY, "old-key")
    assert tck.save_compile_cache(tmp_path / "old.tck").signed_by == signature.key_id(b"old-key")
    monkeypatch.setenv(
        ENV_KEY, "new-key, old-key"
    )  # a rotation: the first signs, both are accepted
    assert tck.load_compile_cache(tmp_path / "old.tck").signature.startswith("verified")
    assert tck.save_compile_cache(tmp_path / "new.tck").signed_by == signature.key_id(b"new-key")
    monkeypatch.setenv(ENV_KEY, "new-key")  # rotation over: the old key's artifacts are refused
    with pytest.warns(CompileCacheWarning, match="signed with key"):
        assert not tck.load_compile_cache(tmp_path / "old.tck")
    assert tck.load_compile_cache(tmp_path / "new.tck")
    assert tck.load_compile_cache(
        tmp_path / "new.tck", key="new-key"
    )  # key= wins over the variable


def test_compile_cache_signs_its_saves_and_never_prints_the_key(
    fake_mega_cache, tmp_path, inductor_dir
):
    with tck.compile_cache(tmp_path / "cc.tck", key=KEY) as session:
        pass
    assert session.saved and session.saved.signed_by == signature.key_id(KEY.encode())
    assert KEY not in repr(session) and KEY not in repr(session.keys)
    with (
        pytest.warns(CompileCacheWarning, match="refused"),
        tck.compile_cache(tmp_path / "cc.tck", key=OTHER, save_on_exit=False) as other,
    ):
        pass
    assert not other.loaded


def test_memory_url_behaves_the_same(fake_mega_cache, inductor_dir):
    pytest.importorskip("fsspec")
    url = "memory://tck-signed/run/cc.tck"
    assert tck.save_compile_cache(url, key=KEY).signed_by
    assert tck.load_compile_cache(url, key=KEY).signature.startswith("verified")
    with pytest.warns(CompileCacheWarning, match="signed with key"):
        assert not tck.load_compile_cache(url, key=OTHER)
    import fsspec

    with fsspec.open(url, "rb") as handle:
        body, trailer = signature.split(handle.read())
    with fsspec.open(url, "wb") as handle:
        handle.write(_rehashed(body, mega_cache=b"planted") + trailer)
    with pytest.warns(CompileCacheWarning, match="does not match its content"):
        assert not tck.load_compile_cache(url, key=KEY)
    assert fake_mega_cache == [FAKE_MEGA]  # only the first, verified load reached the loader


@pytest.mark.parametrize(
    ("key", "error"), [(123, TypeError), ("", ValueError), ([], TypeError), (["ok", 5], TypeError)]
)
def test_a_bad_key_is_refused_at_the_call_naming_it(key, error, tmp_path):
    for call in (
        lambda: tck.save_compile_cache(tmp_path / "cc.tck", key=key),
        lambda: tck.load_compile_cache(tmp_path / "cc.tck", key=key),
        lambda: tck.compile_cache(tmp_path / "cc.tck", key=key).__enter__(),
    ):
        with pytest.raises(error, match="key must"):
            call()


# --- a real artifact: the same hits; a planted pickle never runs
# -----------------------------------


@pytest.mark.slow
def test_a_signed_real_artifact_gives_the_same_hits_and_loss_as_an_unsigned_one(
    cold_artifact, tmp_path
):
    path, cold = cold_artifact
    signed = tmp_path / "signed.tck"
    signed.write_bytes(signature.sign(path.read_bytes(), KEY.encode()))
    warm = run_worker("warm", str(signed), inductor_dir=tmp_path / "fresh", env={ENV_KEY: KEY})
    assert warm["loaded"] and warm["signature"].startswith("verified"), warm["reason"]
    assert warm["stats"]["fxgraph_cache_hit"] == cold["counters"]["fxgraph_cache_miss"]
    assert warm["stats"]["fxgraph_cache_miss"] == 0 and warm["loss"] == cold["loss"]


class _Planted:
    """Unpickling it creates a file: what an attacker's pickle would do, harmlessly."""

    def __init__(self, marker: str) -> None:
        self.marker = marker

    def __reduce__(self):
        return (open, (self.marker, "w"))


def _planted_artifact(data: bytes, marker: str) -> bytes:
    """``data`` with every FX-graph and AOTAutograd entry of its mega-cache replaced by a planted
    pickle, re-hashed. torch unpickles those entries when the compile looks them up."""
    from torch.compiler._cache import CacheArtifactManager, _serialize_single_cache
    from torch.utils._appending_byte_serializer import AppendingByteSerializer

    artifact = unpack(data, current_environment=current_environment())
    entries = CacheArtifactManager.deserialize(artifact.mega_cache)
    planted = pickle.dumps(_Planted(marker))
    for kind in ("inductor", "aot_autograd"):
        entries[kind] = [
            dataclasses.replace(entry, content=planted) for entry in entries.get(kind, [])
        ]
    assert entries["inductor"] and entries["aot_autograd"], sorted(entries)
    serializer = AppendingByteSerializer(serialize_fn=_serialize_single_cache)
    serializer.extend(entries.items())
    return _rehashed(data, mega_cache=serializer.to_bytes())


@pytest.mark.slow
def test_a_planted_pickle_runs_from_an_unsigned_cache_and_never_from_a_refused_one(
    cold_artifact, tmp_path
):
    path, _ = cold_artifact
    signed = signature.sign(path.read_bytes(), KEY.encode())
    body, trailer = signature.split(signed)
    for case in ("no key", "key"):
        marker = tmp_path / f"pwned-{case.replace(' ', '-')}"
        assert not marker.exists()
        attacked = tmp_path / f"{case}.tck"
        # anyone with write access: plant, re-hash, keep the old signature
        attacked.write_bytes(_planted_artifact(body, str(marker)) + trailer)
        inductor_dir = tmp_path / f"inductor-{case.replace(' ', '-')}"
        env = {ENV_KEY: KEY} if case == "key" else {}
        warm = run_worker("warm", str(attacked), inductor_dir=inductor_dir, env=env, may_fail=True)
        if case == "no key":  # without a key: torch unpickled the planted entry (already while
            assert marker.exists(), warm  # loading it: the Triton bundle), and the job broke
            continue
        else:
            assert not warm["loaded"] and "does not match its content" in warm["reason"], warm
            assert not marker.exists()  # nothing from it was unpickled
            planted = pickle.dumps(_Planted(str(marker)))
            assert not [
                p for p in inductor_dir.rglob("*") if p.is_file() and planted in p.read_bytes()
            ]
            assert warm["kernel_files"] == 0
    assert os.path.exists(tmp_path / "pwned-no-key")
