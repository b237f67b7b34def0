"""foreach_map_adam_step and compile_optimizer(impl="foreach_map"): parity with torch.optim."""

from __future__ import annotations

import pytest
import torch
from torch._dynamo.testing import CompileCounterWithBackend

from torchcompile_kit import compile_optimizer
from torchcompile_kit.errors import UnsupportedOptimizerError
from torchcompile_kit.optim import foreach_map_adam_step

STEPS = 10
SHAPES = [(4, 3), (3,), (2, 2, 2), (1,)]


def _tensors(seed: int) -> list[torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    return [torch.randn(shape, generator=gen) for shape in SHAPES]


def _grads(step: int) -> list[torch.Tensor]:
    return _tensors(1000 + step)


def _reference(cls, weight_decay: float, lrs=(1e-2,)):
    """A torch.optim optimizer over fresh params, one param group per lr."""
    params = [torch.nn.Parameter(t) for t in _tensors(0)]
    chunks = [params[i :: len(lrs)] for i in range(len(lrs))]
    groups = [{"params": chunk, "lr": lr} for chunk, lr in zip(chunks, lrs)]
    return params, cls(groups, betas=(0.8, 0.95), eps=1e-6, weight_decay=weight_decay)


@pytest.mark.parametrize("backend", [None, "aot_eager"])
@pytest.mark.parametrize(
    ("cls", "decoupled", "weight_decay"),
    [
        (torch.optim.Adam, False, 0.0),
        (torch.optim.Adam, False, 0.1),
        (torch.optim.AdamW, True, 0.1),
    ],
)
def test_functional_matches_torch_optim(cls, decoupled, weight_decay, backend):
    ref_params, ref_opt = _reference(cls, weight_decay)
    params = _tensors(0)
    exp_avgs = [torch.zeros_like(p) for p in params]
    exp_avg_sqs = [torch.zeros_like(p) for p in params]
    steps = [torch.tensor(0.0) for _ in params]
    lr = torch.tensor(1e-2)
    step_fn = (
        foreach_map_adam_step
        if backend is None
        else torch.compile(foreach_map_adam_step, backend=backend)
    )
    for i in range(STEPS):
        lr.fill_(1e-2 * 0.9**i)  # a changing tensor lr, as a scheduler would
        ref_opt.param_groups[0]["lr"] = 1e-2 * 0.9**i
        for p, g in zip(ref_params, _grads(i)):
            p.grad = g
        ref_opt.step()
        step_fn(
            params,
            _grads(i),
            exp_avgs,
            exp_avg_sqs,
            steps,
            lr=lr,
            betas=(0.8, 0.95),
            eps=1e-6,
            weight_decay=weight_decay,
            decoupled=decoupled,
        )
    for j, p in enumerate(ref_params):
        state = ref_opt.state[p]
        torch.testing.assert_close(params[j], p.detach())
        torch.testing.assert_close(exp_avgs[j], state["exp_avg"])
        torch.testing.assert_close(exp_avg_sqs[j], state["exp_avg_sq"])
        torch.testing.assert_close(steps[j], state["step"])


def test_functional_per_tensor_hyperparameters():
    """A sequence gives each tensor its own value (how param groups are passed in one call)."""
    params, exp_avgs, exp_avg_sqs = _tensors(0), [], []
    exp_avgs = [torch.zeros_like(p) for p in params]
    exp_avg_sqs = [torch.zeros_like(p) for p in params]
    steps = [torch.tensor(0.0) for _ in params]
    lrs = [0.1, 0.1, 0.0, 0.0]
    before = [p.clone() for p in params]
    foreach_map_adam_step(
        params,
        _grads(0),
        exp_avgs,
        exp_avg_sqs,
        steps,
        lr=lrs,
        betas=(0.9, 0.999),
        eps=1e-8,
        weight_decay=0.0,
        decoupled=True,
    )
    assert not torch.equal(params[0], before[0])
    torch.testing.assert_close(params[2], before[2], rtol=0, atol=0)


def test_functional_errors():
    t = [torch.zeros(2)]
    kwargs = {"lr": 1e-3, "betas": (0.9, 0.999), "eps": 1e-8, "weight_decay": 0.0}
    kwargs["decoupled"] = False
    with pytest.raises(ValueError, match=r"same length; got \[1, 1, 1, 1, 0\]"):
        foreach_map_adam_step(t, t, t, t, [], **kwargs)
    with pytest.raises(ValueError, match="lr has 2 values for 1 tensors"):
        foreach_map_adam_step(t, t, t, t, [torch.tensor(0.0)], **{**kwargs, "lr": [1.0, 2.0]})
    sparse = [torch.zeros(2).to_sparse()]
    with pytest.raises(UnsupportedOptimizerError, match="sparse"):
        foreach_map_adam_step(t, sparse, t, t, [torch.tensor(0.0)], **kwargs)


def _model():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 3))


def _batch(step):
    return torch.randn(5, 4, generator=torch.Generator().manual_seed(step))


def _train(model, opt, sched, steps, counter=None, frozen_until=0):
    frames = []
    for i in range(steps):
        # the last layer gets no gradient until `frozen_until`: its state appears later
        model[2].requires_grad_(i >= frozen_until)
        model(_batch(i)).pow(2).mean().backward()
        opt.step()
        if sched is not None:
            sched.step()
        opt.zero_grad()
        frames.append(counter.frame_count if counter else 0)
    return frames


def _assert_same(model, ref_model, opt, ref_opt):
    for p, q in zip(model.parameters(), ref_model.parameters()):
        torch.testing.assert_close(p, q)
        for key in ("exp_avg", "exp_avg_sq", "step"):
            torch.testing.assert_close(opt.state[p][key], ref_opt.state[q][key])


@pytest.mark.parametrize("sched_name", ["lambda", "onecycle"])
@pytest.mark.parametrize("cls", [torch.optim.Adam, torch.optim.AdamW])
def test_compile_optimizer_foreach_map_parity(cls, sched_name):
    model, ref_model = _model(), _model()

    def build(m):
        opt = cls(
            [{"params": m[0].parameters()}, {"params": m[2].parameters(), "lr": 0.003}],
            lr=0.01,
            weight_decay=0.1,
        )
        if sched_name == "lambda":
            return opt, torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 0.9**s)
        return opt, torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=[0.05, 0.02], total_steps=20)

    (opt, sched), (ref_opt, ref_sched) = build(model), build(ref_model)
    counter = CompileCounterWithBackend("aot_eager")
    compile_optimizer(opt, impl="foreach_map", scheduler=sched, backend=counter)
    frames = _train(model, opt, sched, STEPS, counter)
    _train(ref_model, ref_opt, ref_sched, STEPS)
    _assert_same(model, ref_model, opt, ref_opt)
    assert frames[0] == 0 and frames[1] > 0
    assert frames[-1] == frames[1], f"recompiled: {frames}"


def test_compile_optimizer_foreach_map_lazy_state_for_late_grads():
    """No warm-up step from the user, and params that get their first grad later just work."""
    model, ref_model = _model(), _model()
    opt = torch.optim.AdamW(model.parameters(), lr=0.01, weight_decay=0.1)
    ref_opt = torch.optim.AdamW(ref_model.parameters(), lr=0.01, weight_decay=0.1)
    compile_optimizer(opt, impl="foreach_map", backend="aot_eager")
    _train(model, opt, None, 6, frozen_until=3)
    _train(ref_model, ref_opt, None, 6, frozen_until=3)
    _assert_same(model, ref_model, opt, ref_opt)


def test_compile_optimizer_foreach_map_fullgraph():
    """The foreach_map step is one graph (impl='step' cannot take fullgraph=True)."""
    model, ref_model = _model(), _model()
    opt = torch.optim.Adam(model.parameters(), lr=0.01)
    ref_opt = torch.optim.Adam(ref_model.parameters(), lr=0.01)
    compile_optimizer(opt, impl="foreach_map", backend="aot_eager", fullgraph=True)
    _train(model, opt, None, 4)
    _train(ref_model, ref_opt, None, 4)
    _assert_same(model, ref_model, opt, ref_opt)


def test_compile_optimizer_foreach_map_inductor():
    """Generated code matters here: inductor lowers foreach_map to fused C++ kernels."""
    model, ref_model = _model(), _model()
    opt = torch.optim.AdamW(model.parameters(), lr=0.01, weight_decay=0.1)
    ref_opt = torch.optim.AdamW(ref_model.parameters(), lr=0.01, weight_decay=0.1)
    compile_optimizer(opt, impl="foreach_map", backend="inductor")
    _train(model, opt, None, 4)
    _train(ref_model, ref_opt, None, 4)
    _assert_same(model, ref_model, opt, ref_opt)


def _param():
    return [torch.nn.Parameter(torch.zeros(2))]


@pytest.mark.parametrize(
    ("build", "match"),
    [
        (lambda: torch.optim.Adam(_param(), amsgrad=True), "amsgrad=True"),
        (lambda: torch.optim.Adam(_param(), maximize=True), "maximize=True"),
        (lambda: torch.optim.RAdam(_param()), "'RAdam'"),
        (
            lambda: torch.optim.Adam([torch.nn.Parameter(torch.zeros(2, dtype=torch.complex64))]),
            "complex",
        ),
        (
            lambda: torch.optim.Adam(
                [{"params": _param()}, {"params": _param(), "decoupled_weight_decay": True}]
            ),
            "same decoupled_weight_decay",
        ),
    ],
)
def test_foreach_map_unsupported_options(build, match):
    with pytest.raises(UnsupportedOptimizerError, match=match):
        compile_optimizer(build(), impl="foreach_map")
