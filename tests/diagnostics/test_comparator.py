"""The comparator's rule on tensors made to measure (no compiler): a compiled tensor is wrong when
it is more than FACTOR times farther from the higher-precision reference than eager is, above the
rounding floor and the measured noise; a user's rtol/atol replace the rule; integers and NaNs are
exact; small tensors get the run's typical error. docs/diagnostics.md states the rule."""

from __future__ import annotations

import math

import torch

from torchcompile_kit.diagnostics.comparator import (
    FACTOR,
    NEAR_EPS,
    SMALL,
    judge,
    judge_trees,
    needs_reference,
    pool_small_tensors,
)


def _noisy(reference: torch.Tensor, relative: float, seed: int) -> torch.Tensor:
    """``reference`` plus Gaussian noise of ``relative`` times its RMS, stored in float32."""
    noise = torch.randn(
        reference.shape, generator=torch.Generator().manual_seed(seed), dtype=torch.float64
    )
    return (reference + noise * relative * reference.square().mean().sqrt()).float()


def _exact(n: int = 4096, seed: int = 0) -> torch.Tensor:
    return torch.randn(n, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)


def test_compiled_as_far_from_the_reference_as_eager_passes_where_a_fixed_tolerance_refused():
    """A bf16 step's fp32 gradient: eager and compiled each ~0.4% from the exact answer,
    differently. The old fixed fp32 tolerance (rtol 1e-4, atol 1e-5) called that a miscompile."""
    exact = _exact()
    eager, compiled = _noisy(exact, 4e-3, 1), _noisy(exact, 4e-3, 2)
    diff = judge("grad.w", eager, compiled, exact, reference_dtype="float32")
    assert diff.ok and diff.judged_by == "reference" and 0.2 < diff.ratio < 0.6
    assert math.isclose(diff.eager_error, diff.compiled_error, rel_tol=0.1)
    fixed = judge("grad.w", eager, compiled)  # no reference: the dtype's fixed tolerance
    assert not fixed.ok and fixed.judged_by == "tolerance"


def test_compiled_more_than_factor_times_farther_fails_and_says_by_how_much():
    exact = _exact()
    eager, compiled = _noisy(exact, 4e-3, 1), _noisy(exact, 4e-3 * (FACTOR + 1), 2)
    diff = judge("grad.w", eager, compiled, exact, reference_dtype="float32")
    assert not diff.ok and 1.0 < diff.ratio < 1.6
    text = diff.explain()
    assert text.startswith("grad.w: compiled error ") and "vs eager's" in text
    assert "float32 reference" in text and f"allowed {FACTOR:g}x + floor" in text


def test_a_bias_hidden_inside_a_loose_bf16_tolerance_is_caught():
    """The reverse risk: a systematic 2% shift passes bf16's fixed tolerance (rtol 5e-2) but is
    eight times what bf16 rounding did to eager."""
    exact = _exact()
    eager = _noisy(exact, 2.5e-3, 1).bfloat16()
    shifted = (exact * 1.02).bfloat16()
    assert judge("out", eager, shifted).ok  # the old rule: inside bf16's tolerance
    assert not judge("out", eager, shifted, exact, reference_dtype="float32").ok


def test_a_given_tolerance_is_applied_as_written():
    exact = _exact()
    eager = exact.float()
    compiled = eager + 5e-4
    assert judge("y", eager, compiled, exact, tolerance=(0.0, 1e-3)).ok
    strict = judge("y", eager, compiled, exact, tolerance=(0.0, 1e-4))
    assert (
        not strict.ok
        and strict.judged_by == "tolerance"
        and math.isclose(strict.ratio, 5.0, rel_tol=1e-3)
    )
    # only atol given: rtol is the dtype's default (fp32: 1e-4), as torch.testing does
    assert judge("y", eager, compiled, exact, tolerance=(None, 1e-3)).ok


def test_eager_exact_and_compiled_a_few_ulps_off_is_rounding():
    """A loss both sides compute in fp32 from the same logits: eager equals the reference, the
    compiled one is 1 ulp away. The floor (a few epsilons of the dtype) covers it."""
    loss = torch.tensor(4.87, dtype=torch.float32)
    one_ulp = torch.nextafter(loss, torch.tensor(10.0))
    diff = judge("loss", loss, one_ulp, loss.double(), reference_dtype="float64")
    assert diff.eager_error == 0 and diff.ok
    assert not judge("loss", loss, loss + 1e-4, loss.double(), reference_dtype="float64").ok


def test_a_large_sum_in_another_order_is_rounding_and_a_wrong_one_is_not():
    """A loss that is the mean of 287,496 squares (the pad-matmul model of pytorch #196681): eager
    sums in a cascade (0.2 epsilons from float64), vectorised code in lanes, each lane in order
    (45 epsilons here). Both are right; the order is the compiler's. Before the small-tensor
    floor (SCALAR_EPS) the lanes' sum failed as a miscompute."""
    squares = (_exact(287_496) * 14).square()
    lanes = torch.zeros(8, dtype=torch.float32)
    for row in squares.float().view(-1, 8):  # 8 lanes, each summed in order
        lanes += row
    exact = squares.mean().reshape(1)
    eager = squares.float().mean().reshape(1)
    in_lanes = (lanes.sum() / squares.numel()).reshape(1)
    epsilons = ((in_lanes.double() - exact).abs() / exact / torch.finfo(torch.float32).eps).item()
    assert epsilons > 16  # beyond NEAR_EPS of eager: the reference is what decides
    assert judge("loss", eager, in_lanes, exact, reference_dtype="float64").ok
    assert not judge("loss", eager, eager * (1 + 1e-4), exact, reference_dtype="float64").ok


def test_measured_noise_raises_the_floor():
    exact = _exact()
    eager, compiled = exact.float(), _noisy(exact, 1e-3, 2)
    assert not judge("g", eager, compiled, exact, reference_dtype="float64").ok
    diff = judge("g", eager, compiled, exact, reference_dtype="float64", noise=2e-3)
    assert diff.ok and diff.floor == 2e-3 and "noise 0.002" in diff.explain()


def test_integers_are_exact_and_nans_must_agree():
    ids = torch.arange(10)
    assert judge("ids", ids, ids.clone()).ok
    other = ids.clone()
    other[3] = 7
    assert judge("ids", ids, other).judged_by == "exact" and not judge("ids", ids, other).ok
    x = torch.tensor([1.0, float("nan"), 3.0])
    assert judge(
        "x", x, x.clone(), x.double(), reference_dtype="float64"
    ).ok  # NaN where eager has NaN
    y = torch.tensor([1.0, 2.0, 3.0])
    nan = judge("y", y, x, y.double(), reference_dtype="float64")
    assert not nan.ok and "NaN/inf in one run" in nan.note


def test_missing_tensors_and_shapes_fail():
    diffs = judge_trees("out", {"a": torch.ones(2), "b": torch.ones(2)}, {"a": torch.ones(3)})
    assert [(d.name, d.ok) for d in diffs] == [("out.a", False), ("out.b", False)]
    assert (
        "shape (3,) != eager (2,)" in diffs[0].note
        and "missing in the compiled run" in diffs[1].note
    )


def test_a_small_tensor_is_allowed_the_runs_typical_error():
    """A scalar's own eager error is one rounding, anything from 0 up: it is judged against the
    run's typical relative error (the median over the larger tensors) instead."""
    exact_big = _exact(4096)
    loss = torch.tensor([2.0], dtype=torch.float64)
    lucky = loss.float()  # eager hit the reference exactly
    fair = (loss * (1 + 3e-3)).float()  # compiled off by the run's typical relative error
    big = judge(
        "grad.w",
        _noisy(exact_big, 4e-3, 1),
        _noisy(exact_big, 4e-3, 2),
        exact_big,
        reference_dtype="float32",
    )
    alone = judge("loss", lucky, fair, loss, reference_dtype="float32")
    assert not alone.ok  # by its own error alone: a false alarm
    pooled = pool_small_tensors([big, judge("loss", lucky, fair, loss, reference_dtype="float32")])
    assert all(d.ok for d in pooled) and pooled[1].typical is not None and pooled[0].typical is None
    wrong = pool_small_tensors(
        [big, judge("loss", lucky, (loss * 1.05).float(), loss, reference_dtype="float32")]
    )
    assert not wrong[1].ok  # 5%: well beyond what the run's rounding explains
    assert SMALL > 1


def test_rounding_level_differences_need_no_reference_and_16_bit_ones_always_do():
    """The reference costs a run at higher precision: it runs only for a tensor farther from eager
    than NEAR_EPS float32 epsilons (RMS), or any 16-bit tensor that differs."""
    eager = _exact().float()
    eps = torch.finfo(torch.float32).eps
    size = eager.double().square().mean().sqrt().item()
    near = eager + 0.5 * NEAR_EPS * eps * size
    diff = judge("w", eager, near)
    assert (
        diff.ok
        and diff.judged_by == "eager"
        and 0.4 < diff.ratio < 0.6
        and not needs_reference([diff])
    )
    assert "epsilons of eager" in diff.explain()
    far = judge("w", eager, eager + 2 * NEAR_EPS * eps * size)
    assert far.judged_by == "tolerance" and needs_reference([far])
    assert (
        judge(
            "w", eager, eager + 2 * NEAR_EPS * eps * size, _exact(), reference_dtype="float64"
        ).judged_by
        == "reference"
    )
    half = eager.bfloat16()
    assert judge("h", half, half.clone()).judged_by == "eager"  # equal: nothing to judge
    assert needs_reference([judge("h", half, (eager * (1 + 2**-9)).bfloat16())])
