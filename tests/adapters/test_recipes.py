"""The fine-tuning recipe users run, as they run it: LoRA with the dropout most recipes set
(0.05-0.1), under inductor, in fp32 and bf16 autocast, through ``compile_peft`` and through
``CompileTrainer`` with Trainer's own AdamW (its two param groups, weight decay, a scheduler,
gradient accumulation). Each case trains compiled with no false alarm, and a miscompute planted
inside inductor in the same setting is still refused.

Then the recipe matrix: PEFT methods the rule table allows x adapter dropout x precision x loop
(a custom one, HF Trainer) x regional or whole x gradient checkpointing, every pair of settings in
at least one row (pairwise, not the whole product). Each row trains a compiled copy and an eager
one side by side: no false alarm, the compiled optimizer one graph with no recompile, the losses
equal to eager's within rounding (trained to the same loss where dropout draws). Two rows run in
the quick suite (aot_eager), every row in the slow one (inductor, the default).
"""

from __future__ import annotations

import contextlib
import itertools
import warnings
from dataclasses import dataclass

import pytest
import tiny_models
import torch
from miscompute import scaled_dropout_output

from torchcompile_kit import CompileMonitor, compile_peft
from torchcompile_kit.errors import CompiledMismatchError

peft = pytest.importorskip("peft")
transformers = pytest.importorskip("transformers")

pytestmark = pytest.mark.filterwarnings("ignore:.*loss_type=None.*")

TARGETS = ["q_proj", "v_proj"]


def lora_llama(dropout: float, *, seed: int = 0):
    """A tiny Llama with LoRA as peft initialises it (B at zero: the outputs equal the base
    model's, and only B's gradients see the dropout's mask at the first step)."""
    torch.manual_seed(seed)
    config = peft.LoraConfig(r=4, lora_alpha=8, lora_dropout=dropout, target_modules=TARGETS)
    return peft.get_peft_model(tiny_models.llama(), config)


def autocast(precision: str):
    if precision == "bf16-autocast":
        return torch.autocast("cpu", dtype=torch.bfloat16)
    return contextlib.nullcontext()


def train(model, steps: int, precision: str) -> list[float]:
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-2)
    losses = []
    for step in range(steps):
        with autocast(precision):
            loss = model(**tiny_models.token_batch(seed=step % 2)).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        losses.append(loss.item())
    return losses


@pytest.mark.slow
@pytest.mark.parametrize(("dropout", "precision"), [(0.05, "fp32"), (0.1, "bf16-autocast")])
def test_lora_with_dropout_trains_compiled_through_compile_peft(dropout, precision):
    """Regression: inductor drew dropout's masks its own way, so the first-call check found the
    lora_B gradients 'wrong' and refused the recipe (4 of 10 tensors, fp32 and bf16 alike)."""
    model = compile_peft(lora_llama(dropout))  # the defaults: inductor, regional, verify
    with CompileMonitor() as monitor:
        losses = train(model, 4, precision)
    (check,) = [c for c in monitor.first_call_checks if c.state.startswith("train")]
    assert check.status == "passed", check.message()
    assert "fallback_random" in check.note and "gradients" in check.compared
    assert check.failures == 0 and check.tensors > 2
    assert monitor.snapshot()["graphs"] >= 2  # the blocks' forward and backward, compiled
    assert monitor.snapshot()["recompile_limit_hits"] == 0
    assert losses[-1] < losses[0], losses


@pytest.mark.slow
def test_a_miscompute_inside_inductor_next_to_dropout_is_still_refused():
    """The same setting with inductor made wrong where dropout's output goes (x1.01): the outputs
    are still equal (B is zero), the lora_B gradients are not, and the check says so."""
    model = compile_peft(lora_llama(0.1))
    with (
        torch._inductor.config.patch(pre_grad_custom_pass=scaled_dropout_output),
        pytest.raises(CompiledMismatchError) as raised,
    ):
        model(**tiny_models.token_batch()).loss.backward()
    message = str(raised.value)
    assert "backend 'inductor'" in message and "lora_B" in message
    assert "adapter 'default' active, not merged, grad on" in message  # words, not a tuple
    assert raised.value.record.failures >= 1


# --- CompileTrainer with Trainer's own optimizer ------------------------------------------------


def _rows(n: int = 24) -> list[dict]:
    """A period-4 token cycle at each phase: quick to learn, so a loss that falls says training
    happened."""
    rows = []
    for index in range(n):
        ids = [3 + (index + i) % 4 for i in range(16)]
        rows.append({"input_ids": ids, "attention_mask": [1] * 16, "labels": ids})
    return rows


def lora_trainer(tmp_path, model, *, model_backend: str | None, **overrides):
    """CompileTrainer as a LoRA fine-tuning script builds it: Trainer's AdamW (``adamw_torch``:
    its param groups, one with weight decay and one without, empty for LoRA), a warm-up and
    linear schedule, gradient accumulation, bf16 where asked; the optimizer compiled by
    CompileTrainer's default."""
    from torchcompile_kit.integrations import CompileTrainer

    compile_peft(model, **({"backend": model_backend} if model_backend else {}))
    args = training_args(tmp_path, max_steps=20, warmup_steps=3, **overrides)
    return CompileTrainer(model=model, args=args, train_dataset=_rows())


def training_args(output_dir, **overrides) -> transformers.TrainingArguments:
    """A fine-tuning script's arguments: Trainer's AdamW (``adamw_torch``) with weight decay, a
    warm-up and linear schedule, gradient accumulation of two batches."""
    values = {
        "output_dir": str(output_dir),
        "per_device_train_batch_size": 2,
        "gradient_accumulation_steps": 2,
        "learning_rate": 1e-2,
        "weight_decay": 0.01,
        "lr_scheduler_type": "linear",
        "optim": "adamw_torch",
        "logging_steps": 1,
        "save_strategy": "no",
        "report_to": [],
        "use_cpu": True,
        "seed": 0,
        "disable_tqdm": True,
    }
    return transformers.TrainingArguments(**(values | overrides))


def _optimizer_figures(trainer) -> tuple[int, int, int]:
    """(graphs, recompiles, limit hits) of the compiled optimizer's step in the trainer's
    monitor."""
    record = trainer.monitor.record_for(trainer.optimizer.optimizer)
    return record.counts.graphs, len(record.recompiles), len(record.limit_hits)


def test_trainers_own_optimizer_for_a_lora_model_compiles_once(tmp_path):
    """Regression: Trainer's empty no-decay group made the compiled AdamW recompile at every step
    until the limit (7 recompiles and a limit hit in 12 steps), then run eagerly."""
    trainer = lora_trainer(
        tmp_path,
        lora_llama(0.1),
        model_backend="aot_eager",
        # a quick wiring run: dynamo traces the step, nothing generates code
    )
    trainer.compile_optimizer_kwargs = {"backend": "eager"}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        trainer.train()
    groups = trainer.optimizer.optimizer.param_groups
    assert len(groups) == 2 and groups[1]["params"] == []  # Trainer's groups, as it built them
    assert trainer.state.global_step == 20
    graphs, recompiles, hits = _optimizer_figures(trainer)
    assert (graphs, recompiles, hits) == (1, 0, 0)


@pytest.mark.slow
@pytest.mark.parametrize("bf16", [False, True])
def test_compile_trainer_trains_lora_with_dropout_compiled(tmp_path, bf16):
    """The recipe end to end: compile_peft's defaults (inductor, first-call check), LoRA dropout
    0.1, Trainer's AdamW compiled by CompileTrainer with inductor; bf16 autocast where asked."""
    trainer = lora_trainer(tmp_path, lora_llama(0.1), model_backend=None, bf16=bf16)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        trainer.train()
    checks = trainer.monitor.first_call_checks
    assert checks and all(c.status == "passed" for c in checks), [c.message() for c in checks]
    assert _optimizer_figures(trainer) == (1, 0, 0)
    losses = [row["loss"] for row in trainer.state.log_history if "loss" in row]
    assert len(losses) == 20 and sum(losses[:5]) - sum(losses[-5:]) > 0.5, losses  # 0.1 a step


# --- the recipe matrix ----------------------------------------------------------------------------

FACTORS: dict[str, list] = {
    "method": ["lora", "dora", "ia3", "loha"],
    "dropout": [0.0, 0.1],
    "precision": ["fp32", "bf16-autocast", "bf16-weights"],
    "loop": ["custom", "trainer"],
    "compile": ["regional", "whole"],
    "checkpointing": [False, True],
}


def _pairs(row: dict) -> set:
    return {((a, row[a]), (b, row[b])) for a, b in itertools.combinations(FACTORS, 2)}


def pairwise() -> list[dict]:
    """Rows of the product, each the one covering most pairs not yet covered (the product's order
    breaking ties), until every pair of values of two factors is in some row."""
    product = [dict(zip(FACTORS, values)) for values in itertools.product(*FACTORS.values())]
    uncovered = set().union(*(_pairs(row) for row in product))
    rows = []
    while uncovered:
        best = max(product, key=lambda row: len(_pairs(row) & uncovered))
        rows.append(best)
        uncovered -= _pairs(best)
    return rows


MATRIX = pairwise()
QUICK_ROWS = 2


def row_id(row: dict) -> str:
    return "-".join(
        [
            row["method"],
            f"dropout{row['dropout']:g}",
            row["precision"],
            row["loop"],
            row["compile"],
            "ckpt" if row["checkpointing"] else "nockpt",
        ]
    )


def test_every_pair_of_settings_is_in_a_row_of_the_matrix():
    covered = set().union(*(_pairs(row) for row in MATRIX))
    for (a, values_a), (b, values_b) in itertools.combinations(FACTORS.items(), 2):
        for x, y in itertools.product(values_a, values_b):
            assert ((a, x), (b, y)) in covered, (a, x, b, y)
    assert len(MATRIX) <= 16  # CI's time: the slow suite runs every row under inductor


def peft_model(row: dict):
    """A tiny Llama with the row's adapter; the dropout is the adapter's (IA3 has none: the base
    model's attention dropout then)."""
    dropout, method = row["dropout"], row["method"]
    torch.manual_seed(0)
    base = tiny_models.llama(attention_dropout=dropout if method == "ia3" else 0.0)
    if row["checkpointing"] and row["loop"] == "custom":  # Trainer enables it from its arguments
        base.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    config = {
        "lora": lambda: peft.LoraConfig(
            r=4, lora_alpha=8, lora_dropout=dropout, target_modules=TARGETS
        ),
        "dora": lambda: peft.LoraConfig(
            r=4, lora_alpha=8, lora_dropout=dropout, use_dora=True, target_modules=TARGETS
        ),
        "ia3": lambda: peft.IA3Config(
            target_modules=["k_proj", "v_proj", "down_proj"], feedforward_modules=["down_proj"]
        ),
        "loha": lambda: peft.LoHaConfig(r=4, alpha=8, rank_dropout=dropout, target_modules=TARGETS),
    }[method]()
    model = peft.get_peft_model(base, config)
    return model.to(torch.bfloat16) if row["precision"] == "bf16-weights" else model


def trainers_adamw(model) -> torch.optim.AdamW:
    """AdamW as HF Trainer builds it: weights with decay, the rest without (empty for these
    adapters)."""
    trainable = [p for p in model.parameters() if p.requires_grad]
    return torch.optim.AdamW(
        [{"params": trainable, "weight_decay": 0.01}, {"params": [], "weight_decay": 0.0}],
        lr=1e-2,
    )


def custom_loop(model, optimizer, row: dict, steps: int = 4) -> list[float]:
    """A training loop of a user's own: a warm-up and linear schedule, gradient accumulation of
    two batches."""
    scheduler = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda step: min(1.0, (step + 1) / 2) * (1 - step / (2 * steps))
    )
    torch.manual_seed(1)
    losses = []
    for step in range(steps):
        for micro in range(2):
            with autocast(row["precision"]):
                loss = model(**tiny_models.token_batch(seed=2 * step + micro)).loss / 2
            loss.backward()
        optimizer.step()
        scheduler.step()
        optimizer.zero_grad()
        losses.append(2 * loss.item())
    return losses


def trainer_run(model, row: dict, tmp_path, *, compiled: bool, optimizer_kwargs=None):
    from torchcompile_kit.integrations import CompileTrainer

    args = training_args(
        tmp_path / ("compiled" if compiled else "eager"),
        max_steps=4,
        warmup_steps=1,
        bf16=row["precision"] == "bf16-autocast",
        gradient_checkpointing=row["checkpointing"],
        gradient_checkpointing_kwargs={"use_reentrant": False} if row["checkpointing"] else None,
    )
    if compiled:
        trainer = CompileTrainer(
            model=model,
            args=args,
            train_dataset=_rows(16),
            compile_optimizer_kwargs=optimizer_kwargs or {},
        )
    else:
        trainer = transformers.Trainer(model=model, args=args, train_dataset=_rows(16))
    trainer.train()
    losses = [entry["loss"] for entry in trainer.state.log_history if "loss" in entry]
    return trainer, losses


@dataclass(kw_only=True)
class RecipeRun:
    eager: list[float]
    compiled: list[float]
    checks: list
    optimizer: tuple[int, int, int]
    """(graphs, recompiles, limit hits) of the compiled optimizer's step."""


def run_recipe(row: dict, tmp_path, *, backend: str | None, optimizer_backend: str | None):
    """The row trained eagerly and compiled, side by side (``None``: inductor, the default)."""
    from torchcompile_kit import compile_optimizer

    model_kwargs = {"backend": backend} if backend else {}
    optimizer_kwargs = {"backend": optimizer_backend} if optimizer_backend else {}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # DoRA's and LoHa's graph-break warnings, transformers'
        compiled = compile_peft(
            peft_model(row), regional=row["compile"] == "regional", **model_kwargs
        )
        if row["loop"] == "custom":
            eager = peft_model(row)
            eager_losses = custom_loop(eager, trainers_adamw(eager), row)
            optimizer = compile_optimizer(trainers_adamw(compiled), **optimizer_kwargs)
            with CompileMonitor() as monitor:
                losses = custom_loop(compiled, optimizer, row)
            record = monitor.record_for(optimizer)
            checks = monitor.first_call_checks
        else:
            _, eager_losses = trainer_run(peft_model(row), row, tmp_path, compiled=False)
            trainer, losses = trainer_run(
                compiled, row, tmp_path, compiled=True, optimizer_kwargs=optimizer_kwargs
            )
            record = trainer.monitor.record_for(trainer.optimizer.optimizer)
            checks = trainer.monitor.first_call_checks
    figures = (record.counts.graphs, len(record.recompiles), len(record.limit_hits))
    return RecipeRun(eager=eager_losses, compiled=losses, checks=checks, optimizer=figures)


def assert_trains_as_eager(run: RecipeRun, row: dict) -> None:
    assert run.checks and all(c.status == "passed" for c in run.checks), [
        c.message() for c in run.checks
    ]
    assert run.optimizer == (1, 0, 0), run.optimizer  # one graph, no recompile, no limit hit
    assert len(run.compiled) == len(run.eager) == 4
    rtol = 1e-4 if row["precision"] == "fp32" else 2e-2  # bf16: rounding compounds over steps
    if row["dropout"] == 0:  # equal within rounding, step by step
        torch.testing.assert_close(run.compiled, run.eager, rtol=rtol, atol=0)
    else:  # trained to the same loss
        assert run.compiled[-1] == pytest.approx(run.eager[-1], rel=1e-2), (run.compiled, run.eager)
    assert run.compiled[-1] < run.compiled[0], run.compiled


@pytest.mark.parametrize("row", MATRIX[:QUICK_ROWS], ids=row_id)
def test_the_matrix_quick_rows_wired_with_aot_eager(row, tmp_path):
    run = run_recipe(row, tmp_path, backend="aot_eager", optimizer_backend="eager")
    assert_trains_as_eager(run, row)


@pytest.mark.slow
@pytest.mark.parametrize("row", MATRIX, ids=row_id)
def test_the_matrix_under_inductor(row, tmp_path):
    run = run_recipe(row, tmp_path, backend=None, optimizer_backend=None)
    assert_trains_as_eager(run, row)


@pytest.mark.slow
def test_a_miscompute_planted_in_inductor_stops_compile_trainer_at_its_first_step(tmp_path):
    """The same planted miscompute (x1.01 after each dropout, inside inductor) through
    CompileTrainer with LoRA dropout 0.1: training stops at its first step with the check's
    error, before an optimizer step is taken on wrong gradients."""
    model = lora_llama(0.1)
    before = {n: p.detach().clone() for n, p in model.named_parameters() if p.requires_grad}
    trainer = lora_trainer(tmp_path, model, model_backend=None)
    with (
        torch._inductor.config.patch(pre_grad_custom_pass=scaled_dropout_output),
        warnings.catch_warnings(),
        pytest.raises(CompiledMismatchError, match="compile_peft computed a different result"),
    ):
        warnings.simplefilter("ignore")
        trainer.train()
    assert trainer.state.global_step == 0
    for name, param in model.named_parameters():
        if name in before:
            torch.testing.assert_close(param, before[name], rtol=0, atol=0, msg=name)
