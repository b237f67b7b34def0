"""README's recipe through HF Trainer with evaluation: 8 bucket shapes, ``dynamic=False``,
evaluation every few steps and at the end. Every graph of both modes compiles (no recompile-limit
hit), each evaluation logs its own compile figures, and the plan's report predicts what dynamo
compiled.

It used to run out of graphs: 8 training shapes filled dynamo's limit of 8, the first evaluation
(a new grad mode) hit it and ran eagerly, from then on bucket shapes trained eagerly too, the
evaluation's log repeated training's figures and the report said "16 graphs where 1 predicted".
"""

from __future__ import annotations

import pytest
import tiny_models
import torch

from torchcompile_kit import (
    BucketBatchSampler,
    PadToBucketCollator,
    compile_regional,
    get_regional_plan,
)
from torchcompile_kit.integrations import CompileTrainer

transformers = pytest.importorskip("transformers")

BUCKETS = [8, 16, 24, 32, 40, 48, 56, 64]
BATCH = 4


def _rows(lengths: list[int], seed: int) -> list[dict]:
    gen = torch.Generator().manual_seed(seed)
    rows = []
    for length in lengths:
        ids = torch.randint(3, tiny_models.VOCAB, (length,), generator=gen).tolist()
        rows.append({"input_ids": ids, "labels": ids})
    return rows


def _train_lengths() -> list[int]:
    # every bucket holds exactly 2 batches, so drop_last=True leaves its 8 shapes
    return [bucket - offset for bucket in BUCKETS for offset in range(2 * BATCH)][::-1]


def _eval_lengths() -> list[int]:
    # the evaluation loader keeps this order: batches padded to 16, 64, 8 and a last one of 2 rows
    return [9, 12, 3, 16, 60, 2, 33, 7, 5, 6, 7, 8, 30, 31]


def _run(model, tmp_path):
    model = compile_regional(model, dynamic=False, backend="eager")
    train_lengths = _train_lengths()
    sampler = BucketBatchSampler(train_lengths, BUCKETS, batch_size=BATCH, drop_last=True, seed=0)
    assert len(sampler.batch_shapes()) == 8
    eval_rows = _rows(_eval_lengths(), seed=1)
    evaluations = []

    class Evaluations(transformers.TrainerCallback):
        def on_evaluate(self, args, state, control, metrics=None, **kwargs):
            evaluations.append(dict(metrics))

    args = transformers.TrainingArguments(
        output_dir=str(tmp_path),
        per_device_train_batch_size=BATCH,
        per_device_eval_batch_size=BATCH,
        max_steps=16,
        eval_strategy="steps",
        eval_steps=5,
        learning_rate=1e-3,
        optim="sgd",
        logging_steps=5,
        save_strategy="no",
        report_to=[],
        use_cpu=True,
        seed=0,
        disable_tqdm=True,
    )
    trainer = CompileTrainer(
        model=model,
        args=args,
        train_dataset=_rows(train_lengths, seed=0),
        eval_dataset=eval_rows,
        data_collator=PadToBucketCollator(buckets=BUCKETS),
        train_batch_sampler=sampler,
        compile_optimizer_kwargs=None,
        callbacks=[Evaluations()],
    )
    trainer.train()
    final = trainer.evaluate()
    return model, trainer, evaluations, final


@pytest.mark.parametrize(
    "build",
    [tiny_models.bert, pytest.param(tiny_models.llama, marks=pytest.mark.slow)],
    ids=["bert", "llama"],
)
def test_the_readme_recipe_with_evaluation_stays_compiled_and_its_report_adds_up(build, tmp_path):
    model, trainer, evaluations, final = _run(build(), tmp_path)
    monitor = trainer.monitor
    assert monitor.snapshot()["recompile_limit_hits"] == 0 and not monitor.limit_hits, (
        monitor.summary()
    )

    plan = get_regional_plan(model)
    assert len(plan.expected.train) == 8 and len(plan.expected.evaluation) == 4  # 3 buckets + tail
    report = plan.report(monitor)
    # the blocks, and Llama's compiled loss (BERT's masked-LM head computes its own): 8 training
    # shapes and 4 evaluation shapes, a graph each
    assert [g.kind for g in report.groups] in (["blocks"], ["blocks", "function"])
    for row in report.groups:
        assert row.graphs == row.predicted_graphs == 12, report.summary()
    assert not report.flagged, report.summary()
    assert sum(g.graphs for g in report.groups) == monitor.snapshot()["graphs"]

    # each evaluation logged what it compiled itself: the first all 4 shapes of every region,
    # the later ones (the same shapes) nothing
    regions = len(report.groups)
    assert len(evaluations) >= 4, evaluations  # steps 5, 10, 15 (16), and the final evaluate()
    graphs = [row["compile/graphs"] for row in evaluations]
    assert graphs == [4 * regions] + [0] * (len(evaluations) - 1), graphs
    assert all(row["compile/recompile_limit_hits"] == 0 for row in evaluations)
    assert final["compile/graphs"] == trainer.eval_monitor.snapshot()["graphs"] == 0
    # the trainer's own monitor saw the evaluations too
    assert monitor.snapshot()["graphs"] == 12 * regions


def test_evaluation_rows_whose_lengths_cannot_be_read_leave_the_training_shapes_assumed(tmp_path):
    model = compile_regional(tiny_models.gpt2(), dynamic=False, backend="eager")
    args = transformers.TrainingArguments(output_dir=str(tmp_path), report_to=[], use_cpu=True)
    CompileTrainer(
        model=model,
        args=args,
        train_dataset=_rows([8] * 8, seed=0),
        eval_dataset=[(1, 2, 3)] * 4,  # rows that are not mappings
        data_collator=PadToBucketCollator(buckets=BUCKETS),
        compile_optimizer_kwargs=None,
    )
    assert get_regional_plan(model).expected.evaluation == ()
