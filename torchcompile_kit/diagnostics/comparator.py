"""The comparator: is a compiled run a miscompile, or rounding that eager would also make?

Every check that compares a compiled run with eager (the first-call check,
``check_compile_equivalence``, ``compile_optimizer``'s first step, the background worker, ``tune``'s
gate) judges each tensor here. A fixed tolerance cannot tell a wrong kernel from the rounding a
fused kernel is allowed to do: under bf16 autocast eager rounds after every op and inductor once per
fused kernel, and both are equally far from the exact answer. So each tensor is judged against a
**reference**, the same step run eagerly at higher precision (:mod:`.reference`), as torch's own
accuracy checks do (``torch._dynamo.utils.same`` with ``fp64_ref``, the accuracy minifier):

    compiled_error <= FACTOR * eager_error + floor

where an error is the RMS of the difference from the reference, and the floor is the larger of
``ROUNDING_EPS`` machine epsilon of the tensor's dtype times the reference's RMS (an ulp, what
storing the result costs, for tensors eager happens to compute exactly; ``SCALAR_EPS`` of them
for a one-element tensor, a loss summed in the compiler's order) and the measured noise:
eager against eager and compiled against compiled, rerun from the same state, where a check found a
failure to re-judge. A tensor of fewer than ``SMALL`` elements (a loss, a bias) says little about
eager's error on its own (for a scalar, the ratio of two single roundings is anything), so its
``eager_error`` counts as at least the run's typical relative error (the median over the check's
larger tensors) times its own size. A tensor eager computes with no correct digit (its error is as
large as the tensor: a sum that cancels to zero, such as the gradient of a bias followed by a
normalisation) is rounding noise on both sides, and compiled may be ``NOISE_FACTOR`` times farther.
A user's ``rtol``/``atol`` replace the rule for that check: then a tensor passes when ``|compiled -
eager| <= atol + rtol * |eager|`` elementwise, as ``torch.testing`` means them. Without a reference
(integer tensors, a model that cannot run at higher precision) the fixed tolerance of the dtype
applies, and :attr:`TensorDiff.judged_by` says so.

The reference costs a run at higher precision, so it is run only when needed: a compiled float32
or float64 tensor whose RMS difference from eager is within ``NEAR_EPS`` epsilons of its dtype
(times eager's RMS) is rounding-level and passes as it is (torch's ``same()`` likewise tries a
tight ``allclose`` before its fp64 reference); 16-bit tensors always go to the reference, where an
epsilon is too coarse to mean "the last bits". :func:`needs_reference` says whether any tensor needs
it.

The constants were measured: docs/diagnostics.md ("What equal to eager means").
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

import torch

__all__ = [
    "FACTOR",
    "NEAR_EPS",
    "NOISE_FACTOR",
    "ROUNDING_EPS",
    "SCALAR_EPS",
    "SMALL",
    "TensorDiff",
    "judge",
    "judge_trees",
    "leaves",
    "max_abs_difference",
    "needs_reference",
    "pool_small_tensors",
    "rms_differences",
]

FACTOR = 3.0
"""How many times farther from the reference than eager a compiled tensor may be (torch's
``same()`` uses 2 for fp32, 3 for 16-bit). Measured: healthy inductor compiles use at most 0.41 of
the allowance, planted miscomputes at least 9.2 times it (docs/diagnostics.md)."""
ROUNDING_EPS = 1.0
"""The floor, in machine epsilons of the tensor's dtype times the reference's RMS (at least one
unit in the last place of every element): a compiled result an ulp from a reference that eager
happens to match exactly is rounding, not a miscompile."""
NEAR_EPS = 16.0
"""A float32/float64 compiled tensor within this many epsilons of its dtype (RMS, times eager's RMS)
of eager is rounding-level: it passes without a reference (16 float32 epsilons: 2e-6 relative)."""
NOISE_FACTOR = 10.0
"""The factor for a tensor eager computes with no correct digit (eager's error at least the
tensor's RMS): both runs are rounding noise there (torch's ``same()`` allows 10x for its noisiest
tensors); a miscompute is far larger."""
SMALL = 100
"""Tensors with fewer elements are allowed at least the run's typical relative error."""
SCALAR_EPS = 64.0
"""The floor of a one-element tensor (a loss: a sum over many elements), in float32 epsilons (or
its dtype's, if finer) times the reference's RMS: the order of a large sum is the compiler's to
choose. Measured: a 287,496-element mean (the loss of ``tests/doctor/real_bugs.py``'s pad-matmul
model with that module eager) compiled by inductor is 23 float32 epsilons from eager's cascade
sum, scalar code (``cpp.simdlen=1``) 17; eager 0.07 from float64. A miscompute is far larger
(the planted ones: 1e-2)."""

# The fixed tolerances (rtol, atol) per dtype, for tensors judged without a reference.
_TOLERANCES: dict[torch.dtype, tuple[float, float]] = {
    torch.float64: (1e-7, 1e-7),
    torch.float32: (1e-4, 1e-5),
    torch.float16: (1e-2, 1e-3),
    torch.bfloat16: (5e-2, 1e-2),
}

JudgedBy = Literal["reference", "eager", "tolerance", "exact"]


@dataclass(kw_only=True, slots=True)
class TensorDiff:
    """How one tensor of a compiled run compares with eager's, and the verdict on it."""

    name: str
    """``output.logits``, ``loss``, ``grad.<param>``, ``param_after_step.<param>``,
    ``update.<param>`` or ``<step>.<key>``."""
    ok: bool
    ratio: float
    """How much of its allowance the compiled tensor used: at most 1 passes. Against a reference,
    ``compiled_error / (factor * eager_error + floor)``; with a fixed tolerance, the largest
    ``|compiled - eager| / (atol + rtol * |eager|)``."""
    max_abs: float
    """Largest absolute elementwise difference between compiled and eager (``inf`` when the
    tensor is missing on one side or NaN/inf on one side only)."""
    max_rel: float
    """``max_abs`` divided by the largest magnitude of the eager tensor."""
    judged_by: JudgedBy = "reference"
    """``"reference"`` (the rule against a higher-precision run), ``"eager"`` (within
    :data:`NEAR_EPS` of eager: rounding-level, no reference needed), ``"tolerance"`` (a fixed
    rtol/atol: the user's, or the dtype's where no reference exists) or ``"exact"`` (integers)."""
    reference: str = ""
    """The reference's dtype (``"float64"``), ``""`` when judged without one."""
    eager_error: float = math.nan
    """RMS of eager minus the reference."""
    compiled_error: float = math.nan
    """RMS of compiled minus the reference."""
    floor: float = 0.0
    """The allowance that does not scale with eager's error: rounding, or the measured noise."""
    noise: float | None = None
    """The measured run-to-run noise (eager vs eager, compiled vs compiled), when it was measured.
    """
    scale: float = 0.0
    """RMS of the reference tensor."""
    numel: int = 0
    typical: float | None = None
    """For a tensor of fewer than :data:`SMALL` elements: the run's typical relative error, which
    its eager error counts as at least (times :attr:`scale`)."""
    factor: float = FACTOR
    note: str = ""
    """Why the tensors could not be compared elementwise (missing, shape, an exception), if so."""
    step: str = ""
    """The step of a sequence (``"2:mixed batch"``) that produced it; ``""`` for a single batch."""

    def explain(self) -> str:
        """One clause saying how far off it is and against what.

        Example:
            >>> TensorDiff(name="loss", ok=True, ratio=0.1, max_abs=0.0, max_rel=0.0,
            ...            judged_by="exact").explain()
            'loss: equal (exact)'
        """
        if self.note and math.isinf(self.max_abs):
            return f"{self.name}: {self.note}"
        if self.judged_by == "exact":
            return f"{self.name}: {'equal' if self.ok else 'differs'} (exact)"
        if self.judged_by == "eager":
            return (
                f"{self.name}: within {self.ratio * NEAR_EPS:.3g} epsilons of eager (RMS), "
                f"rounding-level (at most {NEAR_EPS:g} pass without a reference)"
            )
        if self.judged_by == "tolerance":
            return (
                f"{self.name}: max_abs={self.max_abs:.3g}, max_rel={self.max_rel:.3g} "
                f"({self.ratio:.3g}x the fixed tolerance)"
            )
        times = (self.compiled_error / self.eager_error) if self.eager_error > 0 else math.inf
        far = f"{times:.3g}x" if math.isfinite(times) else "infinitely"
        noise = "" if self.noise is None else f", noise {self.noise:.3g}"
        typical = (
            ""
            if self.typical is None
            else f", eager's counted as at least {self.typical:.2g} of its size"
        )
        if self.factor == NOISE_FACTOR:
            typical += ", eager has no correct digit: both are rounding noise"
        return (
            f"{self.name}: compiled error {self.compiled_error:.3g} vs eager's "
            f"{self.eager_error:.3g} against the {self.reference} reference ({far} farther; "
            f"allowed {self.factor:g}x + floor {self.floor:.3g}{noise}{typical}: "
            f"{self.ratio:.3g} of the allowance){'; ' + self.note if self.note else ''}"
        )

    def settle(self) -> None:
        """Set :attr:`ratio` and :attr:`ok` from the errors, floor and typical error."""
        basis = self.eager_error
        if self.typical is not None:
            basis = max(basis, self.typical * self.scale)
        allowed = self.factor * basis + self.floor
        self.ratio = (
            0.0
            if self.compiled_error == 0
            else (self.compiled_error / allowed if allowed > 0 else math.inf)
        )
        self.ok = self.ratio <= 1.0


def leaves(tree: Any, prefix: str = "") -> list[tuple[str, torch.Tensor]]:
    """The tensors of a nested output (dicts, tuples, lists, model outputs), named by their path.

    Example:
        >>> [name for name, _ in leaves({"a": torch.ones(1), "b": (torch.ones(1), None)})]
        ['a', 'b.0']
    """
    if isinstance(tree, torch.Tensor):
        return [(prefix, tree)]
    join = (lambda key: f"{prefix}.{key}") if prefix else str
    if isinstance(tree, Mapping):
        return [leaf for key, value in tree.items() for leaf in leaves(value, join(key))]
    if isinstance(tree, (tuple, list)):
        return [leaf for i, value in enumerate(tree) for leaf in leaves(value, join(i))]
    return []  # caches and other objects are not compared


def judge_trees(
    prefix: str,
    eager: Any,
    compiled: Any,
    reference: Any = None,
    *,
    reference_dtype: str = "",
    tolerance: tuple[float | None, float | None] | None = None,
    noise: Mapping[str, float] | None = None,
) -> list[TensorDiff]:
    """One :class:`TensorDiff` per tensor of two nested outputs (a tensor on one side only fails).

    ``reference`` is the same tree from the higher-precision run (``None``: judged by the fixed
    tolerance); ``tolerance`` the user's ``(rtol, atol)``, either ``None`` for the dtype's default;
    ``noise`` the measured run-to-run RMS difference per tensor name.

    Example:
        >>> x = torch.tensor([1.0, 2.0])
        >>> [d.ok for d in judge_trees("out", {"y": x}, {"y": x + 1e-3}, {"y": x.double()},
        ...                            reference_dtype="float64")]
        [False]
    """
    if eager is None or compiled is None:
        if eager is None and compiled is None:
            return []
        return [_missing(prefix, "compiled" if compiled is None else "eager")]
    left, right = dict(leaves(eager)), dict(leaves(compiled))
    exact = dict(leaves(reference)) if reference is not None else {}
    diffs = []
    for key in dict.fromkeys([*left, *right]):  # eager's order: outputs before gradients
        name = _join(prefix, key)
        if key not in left or key not in right:
            diffs.append(_missing(name, "compiled" if key not in right else "eager"))
            continue
        diffs.append(
            judge(
                name,
                left[key],
                right[key],
                exact.get(key),
                reference_dtype=reference_dtype,
                tolerance=tolerance,
                noise=(noise or {}).get(name),
            )
        )
    return pool_small_tensors(diffs)


def pool_small_tensors(diffs: list[TensorDiff]) -> list[TensorDiff]:
    """Give each tensor of fewer than :data:`SMALL` elements judged against the reference the run's
    typical relative error (the median of eager's over the larger ones; over all when there is no
    larger one) as the least its eager error counts for, and settle its verdict again.

    Example:
        >>> diffs = pool_small_tensors([judge("big", torch.ones(100), torch.ones(100),
        ...                                   torch.ones(100,
        ...     dtype=torch.float64), reference_dtype="float64")])
        >>> diffs[0].typical is None
        True
    """
    measured = [d for d in diffs if d.scale > 0 and not math.isnan(d.eager_error)]
    large = [d.eager_error / d.scale for d in measured if d.numel >= SMALL] or [
        d.eager_error / d.scale for d in measured
    ]
    if not large:
        return diffs
    typical = statistics.median(large)
    for diff in measured:
        if diff.numel < SMALL and diff.judged_by == "reference":
            diff.typical = typical
            diff.settle()
    return diffs


def judge(
    name: str,
    eager: torch.Tensor,
    compiled: torch.Tensor,
    reference: torch.Tensor | None = None,
    *,
    reference_dtype: str = "",
    tolerance: tuple[float | None, float | None] | None = None,
    noise: float | None = None,
    floor_scale: torch.Tensor | None = None,
    floor_dtype: torch.dtype | None = None,
) -> TensorDiff:
    """The verdict on one tensor: against ``reference`` by the rule, else by a fixed tolerance.

    ``floor_scale``/``floor_dtype`` set the rounding floor for a tensor derived from a stored one
    (an optimizer's update is judged on the scale and dtype of the parameter it was added to).

    Example:
        >>> eager, exact = torch.tensor([1.0009765625]), torch.tensor([1.001], dtype=torch.float64)
        >>> judge("y", eager, eager + 1e-3, exact, reference_dtype="float64").ok
        False
    """
    if eager.shape != compiled.shape:
        note = f"shape {tuple(compiled.shape)} != eager {tuple(eager.shape)}"
        return TensorDiff(
            name=name, ok=False, ratio=math.inf, max_abs=math.inf, max_rel=math.inf, note=note
        )
    a, b = eager.detach().double().cpu(), compiled.detach().double().cpu()
    max_abs, max_rel, unmatched = _differences(a, b)
    common = {"name": name, "max_abs": max_abs, "max_rel": max_rel}
    if not (eager.is_floating_point() or eager.is_complex()):
        return TensorDiff(
            **common, ok=max_abs == 0, ratio=0.0 if max_abs == 0 else math.inf, judged_by="exact"
        )
    if unmatched:
        return TensorDiff(
            **common,
            ok=False,
            ratio=math.inf,
            judged_by="exact",
            note=f"{unmatched} values are NaN/inf in one run and finite in the other",
        )
    fixed = tolerance is not None and (tolerance[0] is not None or tolerance[1] is not None)
    if fixed:
        return _by_tolerance(common, a, b, eager.dtype, tolerance)
    near = _near_eager(a, b, floor_dtype or eager.dtype, floor_scale)
    if reference is None or reference.shape != eager.shape:
        if near <= 1.0:
            return TensorDiff(**common, ok=True, ratio=near, judged_by="eager", numel=eager.numel())
        return _by_tolerance(common, a, b, eager.dtype, (None, None))
    r = reference.detach().double().cpu()
    finite = a.isfinite() & b.isfinite() & r.isfinite()
    a, b, r = a[finite], b[finite], r[finite]
    size, eager_error = _rms(r), _rms(a - r)
    stored = size if floor_scale is None else max(size, _rms(floor_scale.double()))
    eps = torch.finfo(floor_dtype or eager.dtype).eps
    floor = max(ROUNDING_EPS * eps * stored, noise or 0.0)
    if eager.numel() == 1:  # a loss: a sum over many elements, in the compiler's order
        floor = max(floor, SCALAR_EPS * min(eps, torch.finfo(torch.float32).eps) * stored)
    diff = TensorDiff(
        **common,
        ok=False,
        ratio=math.inf,
        reference=reference_dtype,
        eager_error=eager_error,
        compiled_error=_rms(b - r),
        floor=floor,
        noise=noise,
        scale=size,
        numel=eager.numel(),
        factor=NOISE_FACTOR if 0 < size <= eager_error else FACTOR,
    )
    if near <= 1.0:  # rounding-level against eager: the errors are kept for the record
        diff.ok, diff.ratio, diff.judged_by = True, near, "eager"
    else:
        diff.settle()
    return diff


def needs_reference(diffs: list[TensorDiff]) -> bool:
    """Whether a tensor was judged by the fallback tolerance only because no reference was given
    (neither rounding-level near eager nor exact): then the check should run the reference.

    Example:
        >>> needs_reference([judge("y", torch.ones(3), torch.ones(3))])
        False
    """
    return any(d.judged_by == "tolerance" for d in diffs)


def rms_differences(prefix: str, first: Any, second: Any) -> dict[str, float]:
    """The RMS difference of each tensor two runs of the same call share (the run-to-run noise),
    keyed as :func:`judge_trees` names them.

    Example:
        >>> rms_differences("out", {"y": torch.zeros(2)}, {"y": torch.ones(2)})
        {'out.y': 1.0}
    """
    right = dict(leaves(second))
    found = {}
    for key, tensor in leaves(first):
        other = right.get(key)
        if other is not None and other.shape == tensor.shape and tensor.is_floating_point():
            a, b = tensor.detach().double().cpu(), other.detach().double().cpu()
            finite = a.isfinite() & b.isfinite()
            found[_join(prefix, key)] = _rms(a[finite] - b[finite])
    return found


def max_abs_difference(first: Any, second: Any) -> float:
    """The largest elementwise difference between the tensors two nested outputs share.

    Example:
        >>> max_abs_difference({"y": torch.zeros(2)}, {"y": torch.ones(2)})
        1.0
    """
    right = dict(leaves(second))
    return max(
        (
            (t.detach().double() - right[k].detach().double()).abs().max().item()
            for k, t in leaves(first)
            if k in right and t.shape == right[k].shape and t.numel()
        ),
        default=0.0,
    )


# --- helpers -----------------------------------------------------------------------------------


def _join(prefix: str, key: str) -> str:
    return f"{prefix}.{key}" if prefix and key else prefix or key


def _missing(name: str, side: str) -> TensorDiff:
    return TensorDiff(
        name=name,
        ok=False,
        ratio=math.inf,
        max_abs=math.inf,
        max_rel=math.inf,
        note=f"missing in the {side} run",
    )


def _rms(x: torch.Tensor) -> float:
    return x.square().mean().sqrt().item() if x.numel() else 0.0


def _differences(a: torch.Tensor, b: torch.Tensor) -> tuple[float, float, int]:
    """Largest |a - b| (NaN/inf alike on both sides count as equal), relative to a's largest
    magnitude, and how many values are non-finite on one side only."""
    same_nonfinite = (a.isnan() & b.isnan()) | (a.isinf() & (a == b))
    unmatched = int(((~a.isfinite() | ~b.isfinite()) & ~same_nonfinite).sum())
    diff = (a - b).abs()
    diff[same_nonfinite] = 0.0
    diff = diff.nan_to_num(nan=math.inf)
    if diff.numel() == 0:
        return 0.0, 0.0, 0
    max_abs = diff.max().item()
    scale = a.abs().nan_to_num(nan=0.0, posinf=0.0).max().item()
    max_rel = max_abs / scale if scale > 0 else (0.0 if max_abs == 0 else math.inf)
    return max_abs, max_rel, unmatched


def _near_eager(
    a: torch.Tensor, b: torch.Tensor, dtype: torch.dtype, scale: torch.Tensor | None
) -> float:
    """RMS of ``b - a`` in units of ``NEAR_EPS`` epsilons of ``dtype`` times ``a``'s RMS (or
    ``scale``'s, if larger); 0 for equal tensors; ``inf`` for a 16-bit dtype that differs (always
    judged against the reference)."""
    finite = a.isfinite() & b.isfinite()
    difference = _rms(b[finite] - a[finite])
    if difference == 0:
        return 0.0
    if dtype not in (torch.float32, torch.float64):
        return math.inf
    size = _rms(a[finite]) if scale is None else max(_rms(a[finite]), _rms(scale.double()))
    unit = NEAR_EPS * torch.finfo(dtype).eps * size
    return difference / unit if unit > 0 else math.inf


def _by_tolerance(
    common: dict[str, Any],
    a: torch.Tensor,
    b: torch.Tensor,
    dtype: torch.dtype,
    tolerance: tuple[float | None, float | None],
) -> TensorDiff:
    default_rtol, default_atol = _TOLERANCES.get(dtype, (0.0, 0.0))
    rtol = default_rtol if tolerance[0] is None else tolerance[0]
    atol = default_atol if tolerance[1] is None else tolerance[1]
    diff = (a - b).abs().nan_to_num(nan=0.0, posinf=0.0, neginf=0.0)
    bound = atol + rtol * a.abs().nan_to_num(nan=0.0, posinf=0.0)
    ratio = torch.where(diff == 0, 0.0, diff / bound).max().item() if diff.numel() else 0.0
    return TensorDiff(**common, ok=ratio <= 1.0, ratio=ratio, judged_by="tolerance")
