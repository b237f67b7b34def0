"""compile_in_background (compile_regional or compile_model): training runs eagerly at once, a
worker process compiles, the model switches to the worker's precompiled code at a call boundary; a
worker that fails, hangs or compiled something else leaves training eager with one warning. Inductor
compiles in the worker (seconds); counts and equalities are asserted, never times."""

from __future__ import annotations

import copy
import os
import sys
import textwrap
import time
import warnings
from pathlib import Path

import pytest
import torch

from torchcompile_kit import (
    CompileMonitor,
    _dynamo,
    compile_model,
    compile_regional,
    get_regional_plan,
    uncompile,
)
from torchcompile_kit.errors import CompileCacheWarning
from torchcompile_kit.regional import (
    BackgroundCompile,
    BackgroundState,
    compile_in_background,
    get_background_compile,
)

MODEL = """
import time

import torch


class Block(torch.nn.Module):
    def __init__(self, act="gelu", grad_twice=False):
        super().__init__()
        self.up = torch.nn.Linear(16, 16)
        self.act = getattr(torch.nn.functional, act)
        self.grad_twice = grad_twice

    def forward(self, x):
        y = x + self.act(self.up(x))
        if self.grad_twice and torch.compiler.is_compiling():
            y = y + (y - y.detach())  # compiled only: the same values, twice the gradient
        return y


class Model(torch.nn.Module):
    def __init__(self, act="gelu", grad_twice=False):
        super().__init__()
        self.blocks = torch.nn.ModuleList([Block(act, grad_twice) for _ in range(2)])
        self.head = torch.nn.Linear(16, 1)

    def forward(self, x):
        for block in self.blocks:
            x = block(x)
        return self.head(x).pow(2).mean()


def build():
    torch.manual_seed(0)
    return Model()


def build_silu():
    return Model("silu")


def build_grad_twice():
    return Model(grad_twice=True)


def crash():
    raise RuntimeError("the factory broke")


def hang():
    time.sleep(600)


def killed():
    import os
    import signal

    os.kill(os.getpid(), signal.SIGKILL)
"""


@pytest.fixture
def factory(tmp_path, monkeypatch):
    (tmp_path / "tck_bg_model.py").write_text(textwrap.dedent(MODEL))
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.chdir(tmp_path)  # the worker imports the factory from the training process's cwd
    import tck_bg_model

    yield tck_bg_model
    sys.modules.pop("tck_bg_model", None)


def _train(model, ref=None, *, until, limit_s=300.0):
    """SGD steps (eager reference beside it, on the same batches) until ``until(record)``."""
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    ref_opt = torch.optim.SGD(ref.parameters(), lr=0.01) if ref is not None else None
    losses, ref_losses, started = [], [], time.perf_counter()
    while not until(get_background_compile(model)) and time.perf_counter() - started < limit_s:
        x = torch.randn(4, 16, generator=torch.Generator().manual_seed(len(losses)))
        loss = model(x)
        loss.backward(), opt.step(), opt.zero_grad()
        losses.append(loss.item())
        if ref is not None:
            ref_loss = ref(x)
            ref_loss.backward(), ref_opt.step(), ref_opt.zero_grad()
            ref_losses.append(ref_loss.item())
        time.sleep(0.005)  # a training step's worth of time: the worker needs seconds
    return losses, ref_losses


@pytest.mark.slow
@pytest.mark.torch_window
def test_training_starts_eagerly_and_switches_to_the_workers_precompiled_blocks(factory):
    model = factory.build()
    ref = copy.deepcopy(model)
    with CompileMonitor() as monitor:
        compile_in_background(model, worker=BackgroundCompile(factory="tck_bg_model:build"))
        assert get_regional_plan(model) is None  # nothing compiled in this process yet
        losses, ref_losses = _train(model, ref, until=lambda r: r.stall_s is not None)
        record = get_background_compile(model)
        frames_at_switch = len(monitor.frames)
        more, more_ref = _train(model, ref, until=lambda r: False, limit_s=0.5)
    assert record.state is BackgroundState.COMPILED and record.eager_steps >= 1
    switch = record.switched_at_call - 1  # calls before it ran eagerly
    assert switch == record.eager_steps and record.worker_s > 0 and record.stall_s > 0
    # eager before the switch, bit for bit; compiled (inductor's numerics) after it
    assert losses[:switch] == ref_losses[:switch]
    torch.testing.assert_close(
        torch.tensor(losses[switch:] + more), torch.tensor(ref_losses[switch:] + more_ref)
    )
    (group,) = get_regional_plan(model).groups
    assert group.precompile_path == "precompiled (no trace)"
    assert (
        frames_at_switch == 0 and len(monitor.frames) == 0
    )  # the worker traced; this process never did
    assert any("background compile: compiled from call" in note for note in monitor.notes)
    # the worker compared outputs and gradients on the first batch; the switch, the outputs
    (check,) = monitor.first_call_checks
    assert record.worker_check == "passed" and check.status == "passed"
    assert check.compared == ["outputs", "gradients (the background worker's, same batch)"]
    assert not Path(record._job.parent).exists()  # its folder went with the switch
    assert record._proc.poll() is not None  # the worker is gone


@pytest.mark.slow
def test_a_worker_on_fewer_cpus_compiles_for_trainings_thread_count(factory):
    """CPU kernels are built for a thread count, and a cache saved for another is refused: a worker
    pinned to one CPU compiles for training's two threads (it compiled for one, and the switch
    refused its cache)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        model = factory.build()
        cpus = [min(os.sched_getaffinity(0))]
        compile_in_background(
            model, worker=BackgroundCompile(factory="tck_bg_model:build", cpus=cpus)
        )
        _train(model, until=lambda r: r.stall_s is not None or r.state is BackgroundState.EAGER)
    finally:
        torch.set_num_threads(threads)
    record = get_background_compile(model)
    assert record.state is BackgroundState.COMPILED, record.state
    assert get_regional_plan(model).groups[0].precompile_path == "precompiled (no trace)"


@pytest.mark.parametrize(
    ("background", "why"),
    [
        (
            BackgroundCompile(factory="tck_bg_model:crash"),
            "the worker failed: the process exited 1",
        ),
        (  # the words of tests/test_child_ends.py, as the bench and the doctor say them
            BackgroundCompile(factory="tck_bg_model:hang", timeout_s=1.0),
            "the worker failed: the process had not ended after 1 s (a hang?) and was stopped",
        ),
        (
            BackgroundCompile(factory="tck_bg_model:killed"),
            "the worker failed: the process died with signal 9 (SIGKILL)",
        ),
        # these two compile in the worker (about 20 s each on a 2-core CPU): with the slow tests
        pytest.param(
            BackgroundCompile(factory="tck_bg_model:build_silu"),
            "compiled Block for another model state",
            marks=pytest.mark.slow,
            id="other-model",
        ),
        # the worker's first-call check: the same outputs, other gradients (only its check sees it)
        pytest.param(
            BackgroundCompile(factory="tck_bg_model:build_grad_twice"),
            "CompiledMismatchError",
            marks=pytest.mark.slow,
            id="worker-check-fails",
        ),
    ],
    ids=["crash", "hang", "killed", "other-model", "worker-check-fails"],
)
def test_a_worker_that_fails_hangs_or_compiles_another_model_leaves_training_eager(
    factory, background, why
):
    model = factory.build()
    with pytest.warns(CompileCacheWarning, match="training goes on eagerly") as caught:  # noqa: PT031
        # the warning comes from a training call after the compile call: both belong in the block
        compile_in_background(model, worker=background)
        _train(model, until=lambda r: r.state is BackgroundState.EAGER, limit_s=120)
    record = get_background_compile(model)
    assert record.state is BackgroundState.EAGER and why in record.eager_reason, record.summary()
    assert [
        str(w.message)
        for w in caught
        if w.category is CompileCacheWarning and why in str(w.message)
    ]
    assert get_regional_plan(model) is None and not _dynamo.compiled_module_names(model)
    assert record._proc.poll() is not None and not record._job.parent.exists()
    if background.factory == "tck_bg_model:crash":
        assert "the factory broke" in record.eager_reason  # the worker's own error, in the reason
    if background.factory == "tck_bg_model:build_grad_twice":
        assert "grad.blocks." in record.eager_reason  # the gradients differed


@pytest.mark.slow
def test_a_transformers_model_is_rebuilt_from_its_class_and_config_and_compiled_whole(
    tmp_path, monkeypatch
):
    transformers = pytest.importorskip("transformers")
    import tiny_models

    monkeypatch.chdir(tmp_path)
    model = tiny_models.llama()
    compile_in_background(model, compile_model)
    ids = torch.randint(
        0, model.config.vocab_size, (2, 8), generator=torch.Generator().manual_seed(0)
    )
    started = time.perf_counter()
    while get_background_compile(model).stall_s is None and time.perf_counter() - started < 300:
        model(input_ids=ids, labels=ids).loss.backward()
        time.sleep(0.01)
    record = get_background_compile(model)
    assert record.state is BackgroundState.COMPILED, record.state
    assert isinstance(model, transformers.LlamaForCausalLM) and _dynamo.is_compiled_module(model)


def test_what_the_worker_cannot_reproduce_is_refused_at_the_call(factory):
    model = factory.build()
    with pytest.raises(ValueError, match="has no config"):
        compile_in_background(model)
    with pytest.raises(ValueError, match="backend='inductor'"):
        compile_in_background(
            model, worker=BackgroundCompile(factory="tck_bg_model:build"), backend="aot_eager"
        )
    with pytest.raises(ValueError, match="as JSON"):
        compile_in_background(
            model, worker=BackgroundCompile(factory="tck_bg_model:build"), options={"f": object()}
        )
    for start_after_s in (-1.0, float("nan")):
        with pytest.raises(ValueError, match="start_after_s"):
            compile_in_background(
                model,
                worker=BackgroundCompile(factory="tck_bg_model:build", start_after_s=start_after_s),
            )
    for implied in ("precompile", "verify"):
        with pytest.raises(ValueError, match=f"{implied} is implied"):
            compile_in_background(
                model, worker=BackgroundCompile(factory="tck_bg_model:build"), **{implied: True}
            )
    worker = BackgroundCompile(factory="tck_bg_model:build")
    # a misspelt keyword, or one of compile_regional's given to compile_model: at the call, not
    # in the worker after minutes of compiling
    with pytest.raises(TypeError, match="compile_regional: unexpected keyword blokcs="):
        compile_in_background(model, worker=worker, blokcs=["h.*"])
    with pytest.raises(TypeError, match="compile_model: unexpected keyword blocks="):
        compile_in_background(model, compile_model, worker=worker, blocks=["h.*"])
    assert get_background_compile(model) is None  # nothing set up by a refused call


def test_a_model_compiling_in_the_background_is_not_compiled_again(factory):
    model = factory.build()
    compile_in_background(
        model, worker=BackgroundCompile(factory="tck_bg_model:hang", start_after_s=60)
    )
    again = BackgroundCompile(factory="tck_bg_model:hang")
    for compile_again in (
        compile_regional,
        compile_model,
        lambda m: compile_in_background(m, worker=again),
    ):
        with pytest.warns(UserWarning, match="already compiled"):
            compile_again(model)
    assert get_regional_plan(model) is None and not _dynamo.compiled_module_names(model)
    uncompile(model)
    compile_regional(model, backend="eager")  # after uncompile: allowed again
    assert get_regional_plan(model) is not None


def test_a_worker_on_trainings_own_cores_is_warned_about(factory):
    """On 2 shared cores a compiling worker made eager steps up to 48x slower: a CPU model whose
    threads fill every core hears it at the compile call; one that leaves the worker a core does
    not."""
    threads, cores = torch.get_num_threads(), sorted(os.sched_getaffinity(0))
    try:
        torch.set_num_threads(len(cores))
        model = factory.build()
        with pytest.warns(UserWarning, match="leave none of the CPUs"):
            compile_in_background(model, worker=BackgroundCompile(factory="tck_bg_model:hang"))
        uncompile(model)
        if len(cores) > 1:
            torch.set_num_threads(len(cores) - 1)
            model = factory.build()
            with warnings.catch_warnings():
                warnings.simplefilter("error")
                compile_in_background(
                    model, worker=BackgroundCompile(factory="tck_bg_model:hang", cpus=cores[-1:])
                )
            uncompile(model)
    finally:
        torch.set_num_threads(threads)


def test_uncompile_before_the_switch_stops_the_worker(factory):
    model = factory.build()
    compile_in_background(
        model, worker=BackgroundCompile(factory="tck_bg_model:hang", start_after_s=0)
    )
    model(
        torch.randn(4, 16)
    ).backward()  # the first call hands its batch over and starts the worker
    record = get_background_compile(model)
    assert record.state is BackgroundState.COMPILING and record._proc.poll() is None
    uncompile(model)
    assert (
        record.state is BackgroundState.EAGER
        and record.eager_reason == "cancelled (uncompile)"
        and record._proc.poll() is not None
    )
    assert get_background_compile(model) is None
    model(torch.randn(4, 16)).backward()  # eager, and no worker starts again
    assert record._proc is not None and os.path.exists(str(record._job)) is False


TRAINING = """
import time
import torch
import tck_bg_model
from torchcompile_kit.regional import BackgroundCompile, compile_in_background
from torchcompile_kit.regional import get_background_compile

model = compile_in_background(
    tck_bg_model.build(), worker=BackgroundCompile(factory="tck_bg_model:hang", start_after_s=0)
)
model(torch.randn(4, 16)).backward()  # the first call starts the worker
print(get_background_compile(model)._proc.pid, flush=True)
time.sleep(600)
"""


def _gone(pid: int) -> bool:
    """The process has exited (a zombie no one reaped counts as exited)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0] == "Z"
    except OSError:
        return True


@pytest.mark.slow
@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="reads /proc")
def test_a_killed_training_process_takes_its_worker_with_it(factory, tmp_path):
    """A training process killed outright (SIGKILL, the OOM killer, a job's time limit) runs no
    exit handler: its worker, in a session of its own, went on compiling for minutes on the CPUs
    or GPU the next run needs. It now watches the training process and stops with it."""
    import signal
    import subprocess

    (tmp_path / "train.py").write_text(TRAINING)
    training = subprocess.Popen(
        [sys.executable, "train.py"], stdout=subprocess.PIPE, text=True, cwd=tmp_path
    )
    worker = None
    try:
        worker = int(training.stdout.readline())
        time.sleep(3.0)  # the worker imports torch and reaches its factory, which hangs
        assert not _gone(worker)
        training.send_signal(signal.SIGKILL)
        training.wait()
        deadline = time.monotonic() + 30.0
        while not _gone(worker) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert _gone(worker), "the worker outlived the training process"
    finally:
        training.kill()
        if worker is not None and not _gone(worker):
            os.kill(worker, signal.SIGKILL)


def test_the_worker_starts_start_after_s_into_training_with_its_job_in_hand(factory):
    model = factory.build()
    compile_in_background(
        model, worker=BackgroundCompile(factory="tck_bg_model:hang", start_after_s=0.5)
    )
    record = get_background_compile(model)
    assert record._proc is None  # not at the compile call: its start would slow the first step
    model(torch.randn(4, 16)).backward()
    assert record._proc is None and record._job.exists()  # the first call's job, no worker yet
    time.sleep(0.6)
    model(torch.randn(4, 16)).backward()
    assert record._proc is not None and record._proc.poll() is None
    uncompile(model)
    assert record._proc.poll() is not None


@pytest.mark.slow
def test_a_bf16_autocast_run_switches_once_the_workers_check_passes(tmp_path, monkeypatch):
    """The worker checks its first call under the training process's autocast. With the fixed fp32
    tolerance that check failed under bf16 and training stayed eager for the whole run."""
    pytest.importorskip("transformers")
    import tiny_models

    monkeypatch.chdir(tmp_path)
    model = tiny_models.gpt2(n_layer=2, n_embd=64)
    ids = torch.randint(3, 128, (4, 32), generator=torch.Generator().manual_seed(0))
    with CompileMonitor() as monitor:
        compile_in_background(model)
        started = time.perf_counter()
        while get_background_compile(model).stall_s is None and time.perf_counter() - started < 300:
            with torch.autocast("cpu", dtype=torch.bfloat16):
                loss = model(input_ids=ids, labels=ids).loss
            loss.backward()
            time.sleep(0.01)
    record = get_background_compile(model)
    assert record.state is BackgroundState.COMPILED and record.worker_check == "passed", (
        record.state
    )
    (check,) = monitor.first_call_checks  # the switch's own check, under bf16 too
    assert check.status == "passed" and check.reference == "float32", check.message()


class _Planted:
    """Unpickling it creates a file: what a replaced hand-off pickle could do, harmlessly."""

    def __init__(self, marker):
        self.marker = str(marker)

    def __reduce__(self):
        return (open, (self.marker, "w"))


@pytest.mark.slow
def test_with_a_key_the_hand_off_is_signed_and_a_replaced_batch_never_unpickles(
    factory, tmp_path, monkeypatch
):
    """The worker unpickles the batch the training process hands it. Without a key, whoever can
    write the folder can replace it and run code in the worker; with one, the worker refuses it
    before ``torch.load``."""
    import pickle

    from torchcompile_kit.cache import ENV_KEY

    for case in ("no key", "key"):
        if case == "key":
            monkeypatch.setenv(ENV_KEY, "team-key")
        marker = tmp_path / f"pwned-{case.replace(' ', '-')}"
        model = factory.build()
        compile_in_background(
            model,
            worker=BackgroundCompile(
                factory="tck_bg_model:build", start_after_s=1.0, directory=str(tmp_path / case)
            ),
        )
        model(torch.randn(4, 16)).backward()  # hands the batch over; the worker starts 1 s later
        record = get_background_compile(model)
        batch = record._job.with_name("batch.pt")
        if case == "key":
            assert (
                batch.read_bytes()[-48:-40] == b"TCKSIGN1"
            )  # signed, like the other hand-off files
            assert record._job.read_bytes()[-48:-40] == b"TCKSIGN1"
        batch.write_bytes(pickle.dumps({"args": (_Planted(marker),), "kwargs": {}}))
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            _train(
                model,
                until=lambda r: (
                    r.state not in (BackgroundState.COMPILING, BackgroundState.SWITCHING)
                ),
                limit_s=120,
            )
        assert record.state is BackgroundState.EAGER, record.summary()  # the worker failed
        if case == "no key":
            assert marker.exists()  # today's behaviour without a key: the replaced pickle ran
        else:
            assert not marker.exists() and "not signed" in record.eager_reason, record.summary()
        uncompile(model)


@pytest.mark.parametrize(
    "kwargs", [{"mode": "max-autotune"}, {"blocks": {"blocks.*": {"mode": "reduce-overhead"}}}]
)
def test_a_mode_the_worker_cannot_precompile_is_refused_at_the_call(factory, kwargs):
    """It was refused at the switch, after the worker had compiled for minutes."""
    model = factory.build()
    with pytest.raises(ValueError, match="precompile"):
        compile_in_background(
            model, worker=BackgroundCompile(factory="tck_bg_model:build"), **kwargs
        )
    assert get_background_compile(model) is None


def test_on_a_gpu_without_room_the_worker_is_not_started_and_says_why(factory, monkeypatch):
    """The worker compiles on the training GPU: started with too little free memory, it could make
    training run out of memory. The device and the memory check are stood in for (this machine
    has no GPU); the decision and the record are the library's."""
    from torchcompile_kit.regional import background

    model = factory.build()
    compile_in_background(
        model, worker=BackgroundCompile(factory="tck_bg_model:hang", start_after_s=0)
    )
    monkeypatch.setattr(background, "model_device", lambda model: torch.device("cuda", 0))
    monkeypatch.setattr(torch.cuda, "memory_allocated", lambda device: 3 * 2**30)
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device: (2 * 2**30, 80 * 2**30))
    with pytest.warns(CompileCacheWarning, match="2048 MiB free of 81920 MiB on cuda:0") as warned:
        model(torch.randn(4, 16)).backward()
    record = get_background_compile(model)
    assert record.device == "cuda:0" and record._proc is None  # no worker started
    assert record.state is BackgroundState.EAGER
    assert record.eager_reason.startswith("the worker would compile on the training GPU")
    assert "may need about 6656 MiB" in record.gpu_memory and "foreground" in str(warned[0].message)
