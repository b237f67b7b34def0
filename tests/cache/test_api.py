"""save_compile_cache / load_compile_cache: real round trip, refusals, corruption, interrupted
saves."""

from __future__ import annotations

import os
import warnings

import pytest
import torch

import torchcompile_kit as tck
from torchcompile_kit import _dynamo
from torchcompile_kit.cache import CompileCacheWarning, storage
from torchcompile_kit.cache.artifact import KernelFile, pack
from torchcompile_kit.cache.header import current_environment

from .conftest import FAKE_MEGA, run_worker


def _kernel_files(directory) -> list[str]:
    if not directory.exists():
        return []
    return sorted(str(p.relative_to(directory)) for p in directory.rglob("*") if p.is_file())


def _train_step_proceeds() -> None:
    """Training still runs after a refused/ignored load (aot_eager: no C++ compile needed)."""
    model = torch.nn.Linear(4, 2)
    step = torch.compile(lambda x: model(x).sum(), backend="aot_eager")
    step(torch.randn(3, 4)).backward()
    assert model.weight.grad is not None


@pytest.mark.slow
def test_round_trip_in_fresh_process_gives_cache_hits_and_same_loss(cold_artifact, tmp_path):
    path, cold = cold_artifact
    assert cold["counters"]["fxgraph_cache_miss"] >= 1 and cold["kernel_files"] > 0

    warm = run_worker("warm", str(path), inductor_dir=tmp_path / "fresh-inductor")

    assert warm["loaded"], warm["reason"]
    assert warm["kernel_files"] == cold["kernel_files"]
    assert warm["entries"] == cold["entries"]
    stats = warm["stats"]
    assert stats["fxgraph_cache_hit"] == cold["counters"]["fxgraph_cache_miss"]
    assert stats["fxgraph_cache_miss"] == 0
    assert stats["autograd_cache_hit"] == cold["counters"]["autograd_cache_miss"]
    assert stats["autograd_cache_miss"] == 0
    assert warm["loss"] == cold["loss"]
    # the load started inductor's CPU ISA probe; the compile waited for it and inductor used its
    # answer instead of probing again at the same time (misses would be 2)
    assert warm["isa_probe_started"] and warm["isa_probe_finished"]
    assert warm["isa_probe"]["misses"] == 1 and warm["isa_probe"]["hits"] >= 1, warm["isa_probe"]
    # with the saving process's answer in the artifact, no ISA is checked again
    assert cold["isa_checks"] >= 1 and warm["isa_checks"] == 0, (cold, warm)
    # compile_cache's CompileMonitor saw the same hits
    session = warm["session_stats"]
    assert session["cache_hits"] == stats["fxgraph_cache_hit"] + stats["autograd_cache_hit"]
    assert session["cache_misses"] == 0
    # memory:// round trip of the same process's artifacts
    assert warm["memory"]["saved"] and warm["memory"]["loaded"], warm["memory"]
    assert warm["memory"]["entries"] == cold["entries"]


@pytest.mark.slow
def test_real_artifact_installs_kernels_whole_into_the_inductor_dir(cold_artifact, inductor_dir):
    path, cold = cold_artifact
    result = tck.load_compile_cache(path)
    assert result and result.kernel_files == cold["kernel_files"]
    files = _kernel_files(inductor_dir)
    assert any(name.endswith(".so") for name in files)
    assert not [n for n in files if ".tck-staging" in n], "staging folder left behind"
    # A second load places nothing new (the files are there) but still loads the mega-cache.
    again = tck.load_compile_cache(path)
    assert again and again.kernel_files == 0


def test_absent_artifact_is_silent_and_falsy(tmp_path, inductor_dir):
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        result = tck.load_compile_cache(tmp_path / "none.tck")
    assert not result and "no artifact" in result.reason


@pytest.mark.parametrize("damage", ["empty", "truncated", "bit_flip", "header_flip", "garbage"])
def test_corrupt_artifact_is_ignored_with_a_warning(
    damage, fake_mega_cache, tmp_path, inductor_dir, monkeypatch
):
    # a whole artifact holding a kernel file (the mega-cache faked: what is damaged is the format)
    saving_dir = tmp_path / "saving"
    (saving_dir / "ab").mkdir(parents=True)
    (saving_dir / "ab" / "cabcdef.so").write_bytes(b"\x7fELF kernel" * 100)
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(saving_dir))
    whole = tck.save_compile_cache(tmp_path / "whole.tck")
    assert whole.kernel_files == 1
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(inductor_dir))
    data = bytearray((tmp_path / "whole.tck").read_bytes())
    if damage == "empty":
        data = bytearray()
    elif damage == "truncated":  # also what a half-finished upload looks like
        data = data[: len(data) // 2]
    elif damage == "bit_flip":
        data[len(data) * 3 // 4] ^= 0x01
    elif damage == "header_flip":
        data[70] ^= 0x20
    else:
        data = bytearray(b"\x80\x04not an artifact" * 10)
    path = tmp_path / "damaged.tck"
    path.write_bytes(bytes(data))
    monkeypatch.setattr(_dynamo, "load_mega_cache", lambda data: pytest.fail("mega-cache loaded"))

    with pytest.warns(CompileCacheWarning, match="not loaded") as record:
        result = tck.load_compile_cache(path)

    assert not result
    assert any(word in result.reason for word in ("empty", "truncated", "hash", "not a"))
    assert result.reason in str(record[0].message)
    assert _kernel_files(inductor_dir) == []  # nothing extracted where inductor reads
    _train_step_proceeds()


@pytest.mark.parametrize(
    ("field", "saved_value"),
    [
        ("torch", "2.99.0+cpu"),
        ("cpu_isa", "DEFAULT"),
        ("num_threads", 977),
        ("aten_cpu_capability", "avx2"),
    ],
)
def test_header_mismatch_is_refused_naming_the_field(
    field, saved_value, tmp_path, inductor_dir, monkeypatch
):
    environment = current_environment()
    current_value = environment[field]
    environment[field] = saved_value
    data = pack(
        environment=environment,
        mega_cache=FAKE_MEGA,
        contents={},
        kernel_files=[KernelFile(name="ab/cabc.so", mode=0o755, data=b"\x7fELF")],
    )
    path = tmp_path / "other-env.tck"
    path.write_bytes(data)
    monkeypatch.setattr(_dynamo, "load_mega_cache", lambda data: pytest.fail("mega-cache loaded"))

    with pytest.warns(CompileCacheWarning, match=field) as record:
        result = tck.load_compile_cache(path)

    assert not result
    assert [(m.field, m.saved, m.current) for m in result.mismatches] == [
        (field, saved_value, current_value)
    ]
    message = str(record[0].message)
    assert repr(saved_value) in message and repr(current_value) in message
    assert _kernel_files(inductor_dir) == []
    _train_step_proceeds()


def test_save_then_load_round_trip_local_folder(
    fake_mega_cache, tmp_path, inductor_dir, monkeypatch
):
    kernel = inductor_dir / "q6" / "cq6kernel.so"
    kernel.parent.mkdir(parents=True)
    kernel.write_bytes(b"\x7fELF compiled kernel")
    (inductor_dir / "locks").mkdir()
    (inductor_dir / "locks" / "cq6kernel.lock").write_bytes(b"")
    folder = tmp_path / "ckpt"
    folder.mkdir()

    saved = tck.save_compile_cache(folder)  # a folder gets compile-cache.tck inside
    assert saved and saved.kernel_files == 1 and saved.mega_cache_entries == {"inductor": 3}
    assert saved.path.endswith(storage.DEFAULT_FILE_NAME)
    assert oct(os.stat(saved.path).st_mode & 0o777) == oct(0o644)

    fresh = tmp_path / "fresh-inductor"
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(fresh))  # a second machine's empty dir
    loaded = tck.load_compile_cache(folder)
    assert loaded and loaded.kernel_files == 1
    assert fake_mega_cache == [FAKE_MEGA]
    assert (fresh / "q6" / "cq6kernel.so").read_bytes() == kernel.read_bytes()
    assert _kernel_files(fresh) == ["q6/cq6kernel.so"]  # no lock files, no staging folder
    assert "1 kernel files" in loaded.summary()
    assert loaded.as_dict()["kernel_files"] == 1 and saved.as_dict()["saved"] is True


def test_a_large_kernel_bundle_warns_to_use_a_per_job_dir(
    fake_mega_cache, tmp_path, inductor_dir, monkeypatch
):
    from torchcompile_kit.cache import api

    (inductor_dir / "ab").mkdir(parents=True)
    (inductor_dir / "ab" / "cabkernel.so").write_bytes(b"x" * 2048)
    monkeypatch.setattr(api, "LARGE_KERNEL_BYTES", 1024)
    with pytest.warns(CompileCacheWarning, match="TORCHINDUCTOR_CACHE_DIR"):
        assert tck.save_compile_cache(tmp_path / "cc.tck")


def test_save_with_nothing_compiled_keeps_the_previous_artifact(monkeypatch, tmp_path):
    monkeypatch.setattr(_dynamo, "save_mega_cache", lambda: None)
    path = tmp_path / "cc.tck"
    path.write_bytes(b"previous")
    result = tck.save_compile_cache(path)
    assert not result and "nothing was compiled" in result.reason
    assert path.read_bytes() == b"previous"


def test_interrupted_save_leaves_the_previous_cache_intact(
    fake_mega_cache, tmp_path, inductor_dir, monkeypatch
):
    path = tmp_path / "cc.tck"
    assert tck.save_compile_cache(path)
    previous = path.read_bytes()
    calls = []

    def write_then_die(handle, chunk):
        calls.append(len(chunk))
        if len(calls) == 3:
            raise OSError("disk went away halfway")
        handle.write(chunk)

    original = storage._CHUNK_BYTES, storage._write_chunk
    monkeypatch.setattr(storage, "_CHUNK_BYTES", 64)
    monkeypatch.setattr(storage, "_write_chunk", write_then_die)

    with pytest.warns(CompileCacheWarning, match="disk went away"):
        result = tck.save_compile_cache(path)

    assert not result and len(calls) == 3
    assert path.read_bytes() == previous
    assert [n for n in os.listdir(tmp_path) if n.endswith(".tmp")] == []  # no temp left
    monkeypatch.setattr(storage, "_CHUNK_BYTES", original[0])
    monkeypatch.setattr(storage, "_write_chunk", original[1])
    assert tck.load_compile_cache(path)  # and it still loads


def test_memory_url_round_trip(fake_mega_cache, inductor_dir):
    pytest.importorskip("fsspec")
    saved = tck.save_compile_cache("memory://tck-unit/run/cc.tck")
    loaded = tck.load_compile_cache("memory://tck-unit/run/cc.tck")
    assert saved and loaded and fake_mega_cache == [FAKE_MEGA]


def test_url_without_fsspec_names_the_extra(monkeypatch):
    monkeypatch.setitem(__import__("sys").modules, "fsspec", None)
    with pytest.raises(ImportError, match=r"torchcompile-kit\[remote\]"):
        tck.load_compile_cache("s3://bucket/cc.tck")
    with pytest.raises(ImportError, match=r"torchcompile-kit\[remote\]"):
        tck.save_compile_cache("s3://bucket/cc.tck")


def test_file_url_is_local(fake_mega_cache, tmp_path, inductor_dir):
    saved = tck.save_compile_cache(f"file://{tmp_path}/cc.tck")
    assert saved and (tmp_path / "cc.tck").is_file()
    assert tck.load_compile_cache(f"file://{tmp_path}/cc.tck")
