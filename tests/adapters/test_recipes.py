"""The fine-tuning recipe users run, as they run it: LoRA with the dropout most recipes set
(0.05-0.1), under inductor, in fp32 and bf16 autocast, through ``compile_peft`` and through
``CompileTrainer`` with Trainer's own AdamW (its two param groups, weight decay, a scheduler,
gradient accumulation). Each case trains compiled with no false alarm, and a miscompute planted
inside inductor in the same setting is still refused.
"""

from __future__ import annotations

import contextlib
import warnings

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
    values = {
        "output_dir": str(tmp_path),
        "per_device_train_batch_size": 2,
        "gradient_accumulation_steps": 2,
        "max_steps": 20,
        "learning_rate": 1e-2,
        "weight_decay": 0.01,
        "warmup_steps": 3,
        "lr_scheduler_type": "linear",
        "optim": "adamw_torch",
        "logging_steps": 1,
        "save_strategy": "no",
        "report_to": [],
        "use_cpu": True,
        "seed": 0,
        "disable_tqdm": True,
        **overrides,
    }
    args = transformers.TrainingArguments(**values)
    return CompileTrainer(model=model, args=args, train_dataset=_rows())


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
