"""The correctness gate: a deliberately wrong compiled variant fails, naming the tensor."""

from __future__ import annotations

from torchcompile_kit.tuning import CANDIDATES
from torchcompile_kit.tuning.gate import check_candidate

from . import models

BY_NAME = {c.name: c for c in CANDIDATES}


def build():
    model, make_batch = models.build()
    return model, make_batch(0)


def test_a_perturbing_backend_fails_with_the_offending_tensor():
    verdict = check_candidate(
        BY_NAME["full"],
        model_and_batch=build,
        backend=models.PERTURB_BACKEND,
        overrides={"fullgraph": False},
        device="cpu",
    )
    assert not verdict.ok
    assert verdict.offending.startswith(("output", "loss", "grad", "param_after_step"))
    assert "tolerance" in verdict.offending


def test_a_correct_backend_passes_and_the_compiled_optimizer_is_checked_too():
    verdict = check_candidate(
        BY_NAME["full+compile_optimizer"],
        model_and_batch=build,
        backend="eager",
        overrides={"fullgraph": False},
        device="cpu",
    )
    assert verdict.ok, verdict.offending
    assert verdict.offending is None
    assert "compile_optimizer(Adam): 2 steps compared" in verdict.summary
    assert verdict.graph_breaks == 0


def test_an_error_while_checking_is_a_failed_verdict():
    def broken():
        raise RuntimeError("factory exploded")

    verdict = check_candidate(
        BY_NAME["regional"], model_and_batch=broken, backend="eager", overrides={}, device="cpu"
    )
    assert not verdict.ok and "factory exploded" in verdict.offending
