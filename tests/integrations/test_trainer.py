"""HF Trainer with CompileTrainer: trains, resumes with clean keys, 0 recompiles, logs figures."""

from __future__ import annotations

import functools
import warnings
from pathlib import Path

import pytest
import tiny_models
import torch
from safetensors.torch import load_file
from torch._dynamo.testing import CompileCounterWithBackend

from torchcompile_kit import BucketBatchSampler, PadToBucketCollator, compile_regional
from torchcompile_kit.integrations import CompileTrainer

transformers = pytest.importorskip("transformers")

BUCKETS = [8, 16, 32]


def lm_dataset(n: int = 16, *, seed: int = 0) -> tuple[list[dict], list[int]]:
    """A period-4 token cycle (quick to learn) at random phases and lengths, plus a column the
    model does not take."""
    gen = torch.Generator().manual_seed(seed)
    lengths = torch.randint(4, 31, (n,), generator=gen).tolist()
    starts = torch.randint(0, 4, (n,), generator=gen).tolist()
    rows = []
    for start, length in zip(starts, lengths):
        ids = [3 + (start + i) % 4 for i in range(length)]
        rows.append({"input_ids": ids, "labels": ids, "text": f"row from {start}"})
    return rows, lengths


def training_args(tmp_path: Path, **overrides) -> transformers.TrainingArguments:
    values = {
        "output_dir": str(tmp_path),
        "per_device_train_batch_size": 4,
        "num_train_epochs": 2,
        "learning_rate": 0.3,
        "optim": "sgd",  # compiles in a fraction of AdamW's time; AdamW is tested in tests/optim
        "lr_scheduler_type": "linear",
        "logging_steps": 1,
        "save_strategy": "epoch",
        "report_to": [],
        "use_cpu": True,
        "seed": 0,
        "disable_tqdm": True,
    }
    values.update(overrides)
    return transformers.TrainingArguments(**values)


class _FramesPerEpoch(transformers.TrainerCallback):
    """Records the block counter's frame count at the end of each epoch."""

    def __init__(self, counter: CompileCounterWithBackend) -> None:
        self.counter = counter
        self.frames: list[int] = []

    def on_epoch_end(self, args, state, control, **kwargs):
        self.frames.append(self.counter.frame_count)


def make_trainer(tmp_path: Path, compile_cache=None, compile_cache_key=None, **arg_overrides):
    rows, lengths = lm_dataset()
    counter = CompileCounterWithBackend("aot_eager")
    model = compile_regional(tiny_models.gpt2(), backend=counter)
    frames = _FramesPerEpoch(counter)
    args = training_args(tmp_path, **arg_overrides)
    trainer = CompileTrainer(
        model=model,
        args=args,
        train_dataset=rows,
        data_collator=PadToBucketCollator(buckets=BUCKETS),
        train_batch_sampler=BucketBatchSampler(lengths, BUCKETS, batch_size=4, seed=1),
        compile_optimizer_kwargs={"backend": "eager"},  # wiring: dynamo traces, no AOT
        callbacks=[frames],
        compile_cache=compile_cache,
        compile_cache_key=compile_cache_key,
    )
    return trainer, frames


class _LogConsumer(transformers.TrainerCallback):
    """A log consumer like a report_to integration: keeps what on_log receives."""

    def __init__(self) -> None:
        self.rows: list[dict] = []

    def on_log(self, args, state, control, logs=None, **kwargs):
        self.rows.append(dict(logs))


def test_trainer_trains_resumes_clean_keys_no_recompiles(tmp_path):
    trainer, frames = make_trainer(tmp_path)
    consumer = _LogConsumer()
    trainer.add_callback(consumer)
    trainer.train()

    losses = [row["loss"] for row in trainer.state.log_history if "loss" in row]
    assert len(losses) == len(trainer.get_train_dataloader()) * 2
    half = len(losses) // 2
    assert sum(losses[half:]) / half < 0.7 * sum(losses[:half]) / half, losses
    # every bucket shape was met in epoch 1: epoch 2 compiles nothing
    assert frames.frames[0] >= 1
    assert frames.frames == [frames.frames[0]] * 2, frames.frames
    assert trainer.train_batch_sampler.epoch == 1  # Trainer's set_epoch reached the sampler
    assert getattr(trainer.optimizer.optimizer.step, "_torchcompile_kit_impl", None) == "step"

    # the monitor's figures reach log_history and every consumer's on_log
    for row in [*trainer.state.log_history, *consumer.rows]:
        assert {"compile/graphs", "compile/recompiles", "compile/graph_breaks"} <= set(row)
    last = trainer.state.log_history[-1]
    assert last["compile/graphs"] >= 1 and last["compile/recompile_limit_hits"] == 0
    steps_per_epoch = len(losses) // 2
    assert trainer.state.log_history[steps_per_epoch]["compile/frames"] == last["compile/frames"]

    checkpoints = sorted(tmp_path.glob("checkpoint-*"), key=lambda p: int(p.name.split("-")[1]))
    assert len(checkpoints) == 2
    keys = load_file(str(checkpoints[-1] / "model.safetensors")).keys()
    assert keys and not [k for k in keys if "_orig_mod" in k]
    # the compiled optimizer saved plain floats: a plain torch AdamW could load it
    saved = torch.load(checkpoints[-1] / "optimizer.pt", weights_only=True)
    assert all(type(g["lr"]) is float for g in saved["param_groups"])
    # ... and so did its scheduler: a plain AdamW(foreach=True) resumes from both
    scheduler = torch.load(checkpoints[-1] / "scheduler.pt", weights_only=True)
    assert all(type(v) is float for v in (*scheduler["base_lrs"], *scheduler["_last_lr"]))

    # resume from the epoch-1 checkpoint in a fresh trainer: it trains the last epoch only
    resumed, _ = make_trainer(tmp_path)
    resumed.train(resume_from_checkpoint=str(checkpoints[0]))
    assert resumed.state.global_step == trainer.state.global_step
    for (name, a), b in zip(
        trainer.model.state_dict().items(), resumed.model.state_dict().values()
    ):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5, msg=name)


def test_trainer_loader_keeps_trainer_behaviour(tmp_path):
    trainer, _ = make_trainer(tmp_path)
    loader = trainer.get_train_dataloader()
    worker_init = (
        loader.base_dataloader.worker_init_fn
        if hasattr(loader, "base_dataloader")
        else loader.worker_init_fn
    )
    assert isinstance(worker_init, functools.partial)
    assert worker_init.func is transformers.trainer_utils.seed_worker
    batch = next(iter(loader))
    assert "text" not in batch  # unused column removed, as Trainer's own loader does
    assert batch["input_ids"].shape[1] in BUCKETS


def test_trainer_refuses_whole_model_compile(tmp_path):
    model = compile_regional(tiny_models.gpt2(), backend="aot_eager")
    args = training_args(tmp_path, torch_compile=True, torch_compile_backend="aot_eager")
    with pytest.raises(ValueError, match="torch_compile=False"):
        CompileTrainer(model=model, args=args, train_dataset=lm_dataset()[0])


def test_plain_trainer_with_torch_compile_over_regional_blocks_warns(tmp_path):
    """transformers' own Trainer cannot be made to refuse: the blocks notice the outer trace."""
    model = compile_regional(tiny_models.gpt2(), backend="aot_eager")
    args = training_args(
        tmp_path,
        torch_compile=True,
        torch_compile_backend="aot_eager",
        max_steps=1,
        save_strategy="no",
    )
    trainer = transformers.Trainer(
        model=model,
        args=args,
        train_dataset=lm_dataset()[0],
        data_collator=PadToBucketCollator(buckets=BUCKETS),
    )
    with pytest.warns(
        UserWarning, match=r"regionally \(GPT2Block\).*whole-model torch.compile is tracing it"
    ):
        trainer.train()


def test_trainer_evaluates_compiled_without_a_kv_cache(tmp_path):
    """Trainer sets config.use_cache from TrainingArguments(use_cache=False) (transformers >= 5.23),
    so its eval forwards build no KV cache and the blocks run compiled (a forward that builds a
    cache would run them eagerly, and warn)."""
    trainer, frames = make_trainer(tmp_path, per_device_eval_batch_size=4)
    with warnings.catch_warnings():
        warnings.filterwarnings("error", message=".*KV cache")
        metrics = trainer.evaluate(eval_dataset=lm_dataset(8, seed=1)[0])
    assert metrics["eval_loss"] > 0
    assert frames.counter.frame_count >= 1  # the blocks' eval graph(s): compiled, not eager


def test_trainer_fused_optimizer_with_options_stays_eager_and_names_the_fix(tmp_path):
    model = compile_regional(tiny_models.gpt2(), backend="aot_eager")
    args = training_args(tmp_path, optim="adamw_torch_fused")
    trainer = CompileTrainer(
        model=model,
        args=args,
        train_dataset=lm_dataset()[0],
        compile_optimizer_kwargs={"backend": "aot_eager"},
    )
    with pytest.warns(UserWarning, match=r'kept the AdamW optimizer eager.*optim="adamw_torch"'):
        optimizer = trainer.create_optimizer()
    assert not hasattr(optimizer.step, "_torchcompile_kit_impl")


def test_trainer_compiles_the_optimizer_by_default_and_says_so(tmp_path, caplog):
    model = tiny_models.gpt2()
    args = training_args(tmp_path)  # optim="sgd": compilable
    trainer = CompileTrainer(model=model, args=args, train_dataset=lm_dataset()[0])
    with caplog.at_level("INFO", logger="torchcompile_kit.integrations.trainer"):
        optimizer = trainer.create_optimizer()
    assert hasattr(optimizer.step, "_torchcompile_kit_impl")  # compiled, with the defaults
    assert "compiled the SGD optimizer" in caplog.text
    eager = CompileTrainer(
        model=tiny_models.gpt2(),
        args=args,
        train_dataset=lm_dataset()[0],
        compile_optimizer_kwargs=None,
    )
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # kept eager as asked: nothing to warn about
        assert not hasattr(eager.create_optimizer().step, "_torchcompile_kit_impl")


def test_trainer_default_keeps_an_uncompilable_optimizer_eager_with_a_warning(tmp_path):
    args = training_args(tmp_path, optim="adamw_torch_fused")  # Trainer's own default
    trainer = CompileTrainer(model=tiny_models.gpt2(), args=args, train_dataset=lm_dataset()[0])
    with pytest.warns(UserWarning, match=r'kept the AdamW optimizer eager.*optim="adamw_torch"'):
        optimizer = trainer.create_optimizer()
    assert not hasattr(optimizer.step, "_torchcompile_kit_impl")
    for wrong in (True, False):  # False meant "eager" before: None says it now
        with pytest.raises(TypeError, match=r"compile_optimizer_kwargs.*None \(keep the"):
            CompileTrainer(model=tiny_models.gpt2(), args=args, compile_optimizer_kwargs=wrong)


def trainer_body(rank: int, world: int, out: str) -> None:
    """CompileTrainer on 2 processes: each rank's batches per epoch, and after a
    mid-epoch resume."""
    import torch.distributed as dist

    from integrations.test_accelerate import expected_shards

    rows, lengths = lm_dataset(61)
    for i, row in enumerate(rows):
        row["idx"] = i
    kwargs = {"batch_size": 4, "max_tokens": 64, "seed": 1}
    pad = PadToBucketCollator(buckets=BUCKETS)
    seen: list[list[int]] = []

    def collate(features):  # records the batch, then pads it (the model takes no idx)
        seen.append([f["idx"] for f in features])
        return pad([{k: v for k, v in f.items() if k not in ("idx", "text")} for f in features])

    def run(resume_from=None, save_steps=1000):
        args = training_args(
            Path(out),
            remove_unused_columns=False,
            save_strategy="steps",
            save_steps=save_steps,
            logging_steps=1000,
            learning_rate=0.01,
        )
        trainer = CompileTrainer(
            model=tiny_models.gpt2(),
            args=args,
            train_dataset=rows,
            data_collator=collate,
            train_batch_sampler=BucketBatchSampler(lengths, BUCKETS, **kwargs),
            compile_optimizer_kwargs=None,
            compile_monitor=False,
        )
        trainer.train(resume_from_checkpoint=resume_from)
        return trainer

    expected = [expected_shards(lengths, epoch, world, **kwargs) for epoch in range(2)]
    per_epoch = len(expected[0][0])
    run(save_steps=per_epoch + 3)  # a checkpoint 3 batches into epoch 1
    assert seen == expected[0][rank] + expected[1][rank], (rank, seen)
    everyone = [None] * world
    dist.all_gather_object(everyone, len(seen))
    assert everyone == [2 * per_epoch] * world
    assert expected[0] != expected[1]
    seen.clear()
    run(resume_from=f"{out}/checkpoint-{per_epoch + 3}")
    assert seen == expected[1][rank][3:], (rank, seen)  # exactly the batches not trained on


@pytest.mark.slow
@pytest.mark.distributed
def test_trainer_bucket_sampler_shards_once_and_resumes_two_processes(tmp_path):
    from integrations.spawn import run_on_ranks

    run_on_ranks(trainer_body, str(tmp_path), init_process_group=False)


@pytest.mark.slow
def test_trainer_exposes_its_monitor_and_trains_inside_a_compile_cache(tmp_path):
    """A Trainer user can ask why (``trainer.monitor``) and get warm restarts
    (``compile_cache=``)."""
    path = tmp_path / "cc.tck"
    trainer, _ = make_trainer(
        tmp_path / "out", compile_cache=path, num_train_epochs=1, save_strategy="no"
    )
    trainer.train()
    assert trainer.monitor.frames and "forward_with_checkpointing" in trainer.monitor.summary()
    session = trainer.compile_cache_session
    assert session is not None and session.path == str(path)
    assert not session.loaded, session.loaded.summary()  # nothing there yet: a cold start
    assert session.monitor is not None and session.monitor.frames  # the cache saw the compiles


@pytest.mark.slow
def test_the_trainers_cache_key_signs_its_cache_and_refuses_one_signed_by_another(
    tmp_path, monkeypatch
):
    from torchcompile_kit import _dynamo
    from torchcompile_kit.cache import ENV_KEY, CompileCacheWarning

    monkeypatch.delenv(ENV_KEY, raising=False)
    loaded = []  # torch's mega-cache stands in (aot_eager compiles nothing to save)
    monkeypatch.setattr(_dynamo, "save_mega_cache", lambda: (b"mega-cache " * 64, {"inductor": 1}))
    monkeypatch.setattr(
        _dynamo, "load_mega_cache", lambda data: loaded.append(data) or {"inductor": 1}
    )
    path = tmp_path / "cc.tck"
    trainer, _ = make_trainer(
        tmp_path / "a",
        compile_cache=path,
        compile_cache_key="team-key",
        max_steps=1,
        save_strategy="no",
    )
    trainer.train()
    assert trainer.compile_cache_session.saved.signed_by  # signed with the trainer's key
    same, _ = make_trainer(
        tmp_path / "b",
        compile_cache=path,
        compile_cache_key="team-key",
        max_steps=1,
        save_strategy="no",
    )
    same.train()
    assert same.compile_cache_session.loaded.signature.startswith("verified") and len(loaded) == 1
    other, _ = make_trainer(
        tmp_path / "c",
        compile_cache=path,
        compile_cache_key="other-key",
        max_steps=1,
        save_strategy="no",
    )
    with pytest.warns(CompileCacheWarning, match="signed with key"):
        other.train()
    assert not other.compile_cache_session.loaded and len(loaded) == 1  # nothing of it was used
    with pytest.raises(TypeError, match="key must be a string or bytes"):
        make_trainer(tmp_path / "d", compile_cache=path, compile_cache_key=5)
