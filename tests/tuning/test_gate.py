"""The correctness gate, on the model a run compiled: a wrong compiled variant fails, naming the
tensor; a correct one passes without compiling anything again."""

from __future__ import annotations

import torch

from torchcompile_kit.bench import RECIPES, RecipeContext, apply_recipe, loss_of
from torchcompile_kit.tuning.gate import check_candidate

from . import models


def trained_run(name: str, backend: str, *, steps: int = 3, build=models.build):
    """What a candidate's run leaves behind: its compiled, trained model and optimizer, and an
    eager model rebuilt with the weights the run started from."""
    model, make_batch = build()[:2]
    initial = {k: v.clone() for k, v in model.state_dict().items()}
    ctx = RecipeContext(
        model=model,
        optimizer=torch.optim.Adam(model.parameters(), lr=1e-3),
        backend=backend,
        overrides={"fullgraph": False},
        device=torch.device("cpu"),
    )
    apply_recipe(RECIPES[name], ctx)
    for step in range(steps):  # the compiled optimizer compiles at its second step
        ctx.optimizer.zero_grad()
        loss_of(ctx.model(**make_batch(step))).backward()
        ctx.optimizer.step()
    torch.manual_seed(123)  # the rebuilt model's own init differs: the saved weights are loaded
    reference = build()[0]
    reference.load_state_dict(initial)
    return ctx, reference, make_batch(0)


def check(name: str, ctx, reference, batch, backend: str):
    return check_candidate(
        RECIPES[name],
        model=ctx.model,
        reference=reference,
        batch=batch,
        optimizer=ctx.optimizer,
        backend=backend,
        overrides=ctx.overrides,
    )


def test_a_perturbing_backend_fails_with_the_offending_tensor():
    ctx, reference, batch = trained_run("full", models.PERTURB_BACKEND)
    verdict = check("full", ctx, reference, batch, models.PERTURB_BACKEND)
    assert not verdict.ok
    assert verdict.offending.startswith(("0:train", "1:train"))
    assert (
        "against the float64 reference" in verdict.offending
        and "of the allowance" in verdict.offending
    )


def test_the_runs_own_compiled_model_and_optimizer_pass_without_compiling_again():
    ctx, reference, batch = trained_run("compile-optimizer", "eager")
    verdict = check("compile-optimizer", ctx, reference, batch, "eager")
    assert verdict.ok, verdict.offending
    assert verdict.offending is None
    assert (
        "2 steps of the run's compiled optimizer, each compared with an eager Adam step"
        in verdict.summary
    )
    # the run's trained weights differ from the reference's by three Adam steps, far outside the
    # tolerance: a pass means the check set the compiled model back to the starting weights
    assert verdict.new_graphs == 0  # the run's graphs (model and optimizer step) were reused


def test_regional_is_checked_on_its_compiled_blocks_without_compiling_again():
    ctx, reference, batch = trained_run("regional", "aot_eager")
    verdict = check("regional", ctx, reference, batch, "aot_eager")
    assert verdict.ok, verdict.offending
    assert verdict.new_graphs == 0


def test_an_error_while_checking_is_a_failed_verdict():
    ctx, _, batch = trained_run("regional", "eager", steps=1)
    wrong = torch.nn.Linear(2, 2)  # not the run's architecture: its weights cannot be loaded
    verdict = check("regional", ctx, wrong, batch, "eager")
    assert not verdict.ok and "RuntimeError" in verdict.offending
    assert "state_dict" in verdict.offending
