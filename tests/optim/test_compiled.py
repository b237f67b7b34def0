"""compile_optimizer, zero_grads_in_place: parity with eager torch.optim, recompiles, state dicts,
errors."""

from __future__ import annotations

import copy
import itertools
import warnings
from collections.abc import Callable

import pytest
import torch
from torch._dynamo.testing import CompileCounterWithBackend

from torchcompile_kit import compile_optimizer, uncompile
from torchcompile_kit.errors import UnsupportedOptimizerError
from torchcompile_kit.optim import zero_grads_in_place

STEPS = 12
TOTAL = 20  # schedule length, longer than the run so every schedule keeps changing the LR

OPTIMIZERS: dict[str, Callable[..., torch.optim.Optimizer]] = {
    "sgd_momentum": lambda params: torch.optim.SGD(params, lr=0.05, momentum=0.9),
    "adam": lambda params: torch.optim.Adam(params, lr=0.01),
    "adamw": lambda params: torch.optim.AdamW(params, lr=0.01, weight_decay=0.1),
}


def _hf_linear_warmup(opt):
    from transformers import get_linear_schedule_with_warmup

    return get_linear_schedule_with_warmup(opt, num_warmup_steps=3, num_training_steps=TOTAL)


SCHEDULERS: dict[str, Callable[[torch.optim.Optimizer], object]] = {
    "lambda": lambda opt: torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 0.9**s),
    "step": lambda opt: torch.optim.lr_scheduler.StepLR(opt, step_size=3, gamma=0.5),
    "cosine": lambda opt: torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=TOTAL),
    "onecycle": lambda opt: torch.optim.lr_scheduler.OneCycleLR(
        opt, max_lr=0.05, total_steps=TOTAL
    ),
    "hf_linear_warmup": _hf_linear_warmup,
}


def _model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 3))


def _batch(step: int) -> torch.Tensor:
    return torch.randn(5, 4, generator=torch.Generator().manual_seed(step))


def _train(model, opt, sched, *, steps=STEPS, counter=None) -> list[int]:
    """Run ``steps`` training steps; return the frame count after each (when counting)."""
    frames = []
    for i in range(steps):
        model(_batch(i)).pow(2).mean().backward()
        opt.step()
        if sched is not None:
            sched.step()
        opt.zero_grad()
        frames.append(counter.frame_count if counter is not None else 0)
    return frames


def _assert_same_training(model, ref_model, opt, ref_opt) -> None:
    for p, q in zip(model.parameters(), ref_model.parameters()):
        torch.testing.assert_close(p, q)
        state, ref_state = opt.state[p], ref_opt.state[q]
        assert state.keys() == ref_state.keys()
        for key in state:
            torch.testing.assert_close(state[key], ref_state[key], check_dtype=False)
    for group, ref_group in zip(opt.param_groups, ref_opt.param_groups):
        assert float(group["lr"]) == pytest.approx(float(ref_group["lr"]), rel=1e-6)


def _recompiles(frames: list[int]) -> int:
    """Steps after the first compiled one (step 2) that compiled another frame."""
    return sum(b > a for a, b in itertools.pairwise(frames[1:]))


@pytest.mark.parametrize("sched_name", SCHEDULERS)
@pytest.mark.parametrize("opt_name", OPTIMIZERS)
def test_parity_and_no_recompiles_under_schedules(opt_name, sched_name):
    model, ref_model = _model(), _model()
    opt, ref_opt = (
        OPTIMIZERS[opt_name](model.parameters()),
        OPTIMIZERS[opt_name](ref_model.parameters()),
    )
    sched, ref_sched = SCHEDULERS[sched_name](opt), SCHEDULERS[sched_name](ref_opt)
    counter = CompileCounterWithBackend("aot_eager")
    compile_optimizer(opt, scheduler=sched, backend=counter)

    frames = _train(model, opt, sched, counter=counter)
    _train(ref_model, ref_opt, ref_sched)

    _assert_same_training(model, ref_model, opt, ref_opt)
    assert frames[0] == 0, "the first step initialises state eagerly"
    assert frames[1] > 0, "later steps run compiled"
    if opt_name == "sgd_momentum" and sched_name == "onecycle":
        # SGD's `momentum` stays a float (a tensor would graph-break `if momentum != 0`): the
        # first change recompiles once, after which dynamo treats the float as dynamic.
        assert _recompiles(frames) == 1
    else:
        assert _recompiles(frames) == 0, frames


# LRScheduler's warnings when optimizer.step is replaced behind its back (the naive controls).
_SCHEDULER_ORDER_WARNINGS = "ignore:(Detected call of|Seems like):UserWarning"


def _compile_naively(opt, backend) -> None:
    """``torch.compile`` the class's step as the tutorials do, without compile_optimizer."""
    opt.step = torch.compile(type(opt).step.__get__(opt), backend=backend)


@pytest.mark.filterwarnings(_SCHEDULER_ORDER_WARNINGS)
def test_float_lr_without_compile_optimizer_does_recompile():
    """The control for the test above: a plain compiled step recompiles when a float lr changes."""
    model = _model()
    opt = torch.optim.Adam(model.parameters(), lr=0.01)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 0.9**s)
    counter = CompileCounterWithBackend("aot_eager")
    _compile_naively(opt, counter)
    frames = _train(model, opt, sched, steps=4, counter=counter)
    assert frames[-1] > frames[0]


@pytest.mark.slow
def test_onecycle_adam_no_recompiles_under_inductor():
    """OneCycleLR's float betas recompile Adam under inductor until the limit; tensor betas don't.

    (aot_eager lifts the floats after one recompile, so only inductor shows the real failure.)
    """
    model, ref_model = _model(), _model()
    opt, ref_opt = (torch.optim.AdamW(m.parameters(), lr=0.01) for m in (model, ref_model))
    sched = SCHEDULERS["onecycle"](opt)
    ref_sched = SCHEDULERS["onecycle"](ref_opt)
    counter = CompileCounterWithBackend("inductor")
    compile_optimizer(opt, scheduler=sched, backend=counter)
    frames = _train(model, opt, sched, steps=6, counter=counter)
    _train(ref_model, ref_opt, ref_sched, steps=6)
    _assert_same_training(model, ref_model, opt, ref_opt)
    assert _recompiles(frames) == 0, frames


@pytest.mark.slow
@pytest.mark.filterwarnings(_SCHEDULER_ORDER_WARNINGS)
def test_onecycle_float_betas_recompile_under_inductor_without_compile_optimizer():
    """The control for the test above: a tensor lr alone leaves OneCycle's betas recompiling."""
    model = _model()
    opt = torch.optim.AdamW(model.parameters(), lr=torch.tensor(0.01), foreach=False)
    sched = SCHEDULERS["onecycle"](opt)
    counter = CompileCounterWithBackend("inductor")
    _compile_naively(opt, counter)
    frames = _train(model, opt, sched, steps=5, counter=counter)
    assert _recompiles([0, *frames]) >= 3, frames


def test_param_groups_with_different_lrs():
    model, ref_model = _model(), _model()

    def build(m):
        return torch.optim.AdamW(
            [{"params": m[0].parameters(), "lr": 0.02}, {"params": m[2].parameters()}],
            lr=0.001,
            weight_decay=0.05,
        )

    opt, ref_opt = build(model), build(ref_model)
    lambdas = [lambda s: 0.9**s, lambda s: 1.0 / (1 + s)]
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambdas)
    ref_sched = torch.optim.lr_scheduler.LambdaLR(ref_opt, lambdas)
    counter = CompileCounterWithBackend("aot_eager")
    compile_optimizer(opt, scheduler=sched, backend=counter)
    frames = _train(model, opt, sched, counter=counter)
    _train(ref_model, ref_opt, ref_sched)
    _assert_same_training(model, ref_model, opt, ref_opt)
    assert _recompiles(frames) == 0
    lr0, lr1 = (g["lr"] for g in opt.param_groups)
    assert float(lr0) != pytest.approx(float(lr1))


def test_scheduler_created_after_compile_and_closure():
    model, ref_model = _model(), _model()
    opt = compile_optimizer(torch.optim.Adam(model.parameters(), lr=0.01), backend="aot_eager")
    ref_opt = torch.optim.Adam(ref_model.parameters(), lr=0.01)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=2, gamma=0.5)
    ref_sched = torch.optim.lr_scheduler.StepLR(ref_opt, step_size=2, gamma=0.5)
    for i in range(STEPS):
        for m, o, s in ((model, opt, sched), (ref_model, ref_opt, ref_sched)):

            def closure(m=m, o=o, i=i):
                o.zero_grad()
                loss = m(_batch(i)).pow(2).mean()
                loss.backward()
                return loss

            loss = o.step(closure)
            assert isinstance(loss, torch.Tensor)
            s.step()
    _assert_same_training(model, ref_model, opt, ref_opt)
    with warnings.catch_warnings():  # no "lr_scheduler.step() before optimizer.step()" warning
        warnings.simplefilter("error")
        model(_batch(0)).sum().backward()
        opt.step()
        sched.step()


def test_cpu_tensor_lr_with_foreach_true_is_handled():
    """Adam(foreach=True) with a tensor lr raises on CPU; compile_optimizer switches it off."""
    model, ref_model = _model(), _model()
    opt = torch.optim.Adam(model.parameters(), lr=0.01, foreach=True)
    ref_opt = torch.optim.Adam(ref_model.parameters(), lr=0.01, foreach=True)
    compile_optimizer(opt, backend="aot_eager")
    _train(model, opt, None)
    assert opt.param_groups[0]["foreach"] is True, "the user's choice between steps"
    _train(ref_model, ref_opt, None)
    _assert_same_training(model, ref_model, opt, ref_opt)
    assert opt.state_dict()["param_groups"][0]["foreach"] is True, "the user's choice is saved"


@pytest.mark.parametrize("opt_name", ["adamw", "sgd_momentum"])
def test_state_dict_round_trip_into_plain_and_compiled_optimizer(opt_name):
    model = _model()
    opt = OPTIMIZERS[opt_name](model.parameters())
    sched = SCHEDULERS["onecycle"](opt)
    compile_optimizer(opt, scheduler=sched, backend="aot_eager")
    _train(model, opt, sched, steps=5)
    saved = opt.state_dict()
    group = saved["param_groups"][0]
    assert type(group["lr"]) is float
    assert all(type(v) is float for v in group.get("betas", ()))

    # a plain optimizer (foreach=True would raise with a tensor lr on CPU) loads and steps
    plain_model, compiled_model = copy.deepcopy(model), copy.deepcopy(model)
    plain = OPTIMIZERS[opt_name](plain_model.parameters())
    plain.load_state_dict(copy.deepcopy(saved))
    for g in plain.param_groups:
        g["foreach"] = True
    again = compile_optimizer(
        OPTIMIZERS[opt_name](compiled_model.parameters()), backend="aot_eager"
    )
    again.load_state_dict(copy.deepcopy(saved))
    assert again.param_groups[0]["lr"] == pytest.approx(group["lr"])
    _train(plain_model, plain, None, steps=3)
    _train(compiled_model, again, None, steps=3)
    _assert_same_training(compiled_model, plain_model, again, plain)


@pytest.mark.parametrize("foreach", [True, None])
@pytest.mark.parametrize("sched_order", ["before", "after"])
def test_resume_round_trip_compiled_plain_compiled(foreach, sched_order):
    """Optimizer *and* scheduler checkpoints: compiled -> plain -> compiled equals one plain run.

    A scheduler built on a compiled optimizer used to save float64 tensors (``base_lrs``,
    ``_last_lr``); loaded with a plain ``AdamW(foreach=True)`` its ``step()`` wrote a tensor lr
    and the next step raised "lr as a Tensor is not supported for capturable=False and
    foreach=True" (with ``foreach=None`` it fell back to the slow loop silently).
    """

    def build(model, compiled):
        opt = torch.optim.AdamW(model.parameters(), lr=0.01, weight_decay=0.1, foreach=foreach)
        if sched_order == "before":
            sched = SCHEDULERS["cosine"](opt)
        if compiled:
            compile_optimizer(opt, backend="aot_eager")
        if sched_order == "after":
            sched = SCHEDULERS["cosine"](opt)
        return opt, sched

    def run(model, opt, sched, steps, start):
        for i in range(start, start + steps):
            model(_batch(i)).pow(2).mean().backward()
            opt.step()
            sched.step()
            opt.zero_grad()

    ref_model = _model()
    ref_opt, ref_sched = build(ref_model, compiled=False)
    run(ref_model, ref_opt, ref_sched, 9, 0)

    model = _model()
    opt, sched = build(model, compiled=True)
    run(model, opt, sched, 3, 0)
    checkpoint = copy.deepcopy(
        {"model": model.state_dict(), "opt": opt.state_dict(), "sched": sched.state_dict()}
    )
    for value in (*checkpoint["sched"]["base_lrs"], *checkpoint["sched"]["_last_lr"]):
        assert type(value) is float, checkpoint["sched"]
    for stage, compiled in (("plain", False), ("compiled", True)):
        model = _model()
        model.load_state_dict(checkpoint["model"])
        opt, sched = build(model, compiled=compiled)
        opt.load_state_dict(checkpoint["opt"])
        sched.load_state_dict(checkpoint["sched"])
        start = 3 if stage == "plain" else 6
        run(model, opt, sched, 3, start)
        assert all(type(g["lr"]) is float for g in opt.param_groups), stage
        checkpoint = copy.deepcopy(
            {"model": model.state_dict(), "opt": opt.state_dict(), "sched": sched.state_dict()}
        )
    _assert_same_training(model, ref_model, opt, ref_opt)
    assert sched.get_last_lr() == pytest.approx(ref_sched.get_last_lr())


def test_add_param_group_after_compile():
    model, ref_model = _model(), _model()
    opt = torch.optim.SGD(model[0].parameters(), lr=0.05, momentum=0.9)
    ref_opt = torch.optim.SGD(ref_model[0].parameters(), lr=0.05, momentum=0.9)
    compile_optimizer(opt, backend="aot_eager")
    _train(model, opt, None, steps=2)
    _train(ref_model, ref_opt, None, steps=2)
    opt.add_param_group({"params": model[2].parameters(), "lr": 0.01})
    ref_opt.add_param_group({"params": ref_model[2].parameters(), "lr": 0.01})
    _train(model, opt, None, steps=3)
    _train(ref_model, ref_opt, None, steps=3)
    _assert_same_training(model, ref_model, opt, ref_opt)


def test_float_written_by_a_custom_schedule_is_filled_back():
    """A hand-written schedule assigning ``group["lr"] = float`` neither recompiles nor drifts."""
    model, ref_model = _model(), _model()
    opt = torch.optim.AdamW(model.parameters(), lr=0.01)
    ref_opt = torch.optim.AdamW(ref_model.parameters(), lr=0.01)
    counter = CompileCounterWithBackend("aot_eager")
    compile_optimizer(opt, backend=counter)
    frames = []
    for i in range(6):
        for m, o in ((model, opt), (ref_model, ref_opt)):
            o.param_groups[0]["lr"] = 0.01 * 0.8**i
            m(_batch(i)).pow(2).mean().backward()
            o.step()
            o.zero_grad()
        frames.append(counter.frame_count)
        assert opt.param_groups[0]["lr"] == 0.01 * 0.8**i, "the group keeps what was written"
    _assert_same_training(model, ref_model, opt, ref_opt)
    assert _recompiles(frames) == 0, frames


def test_user_tensor_lr_is_kept():
    model = _model()
    lr = torch.tensor(0.01)
    opt = compile_optimizer(torch.optim.SGD(model.parameters(), lr=lr), backend="aot_eager")
    assert opt.param_groups[0]["lr"] is lr


def test_static_grads_with_zero_grads_marks_and_keeps_storage():
    model = _model()
    opt = compile_optimizer(
        torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9),
        static_grads=True,
        backend="aot_eager",
    )
    ptrs = None
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)
        for i in range(4):
            model(_batch(i)).pow(2).mean().backward()
            opt.step()
            if ptrs is None:
                ptrs = [p.grad.data_ptr() for p in model.parameters()]
            zero_grads_in_place(model)
    assert [p.grad.data_ptr() for p in model.parameters()] == ptrs
    assert all(p.grad._dynamo_static_input_type == "unguarded" for p in model.parameters())


def test_static_grads_warns_when_grads_are_reallocated():
    model = _model()
    opt = compile_optimizer(
        torch.optim.Adam(model.parameters(), lr=0.01), static_grads=True, backend="aot_eager"
    )
    with pytest.warns(RuntimeWarning, match="re-allocated"):
        _train(model, opt, None, steps=4)  # zero_grad() sets grads to None: new tensors each step


@pytest.mark.parametrize("kind", ["module", "optimizer", "iterable"])
def test_zero_grads_in_place(kind):
    model = _model()
    model(_batch(0)).sum().backward()
    model[2].bias.grad = None
    grads = {name: p.grad for name, p in model.named_parameters() if p.grad is not None}
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    zero_grads_in_place({"module": model, "optimizer": opt, "iterable": model.parameters()}[kind])
    for name, p in model.named_parameters():
        if name in grads:
            assert p.grad is grads[name] and not p.grad.any()
        else:
            assert p.grad is None


def test_zero_grads_rejects_other_types():
    with pytest.raises(TypeError, match="'int'"):
        zero_grads_in_place(3)


def _params():
    return [torch.nn.Parameter(torch.zeros(2))]


@pytest.mark.parametrize(
    ("build", "kwargs", "match"),
    [
        (lambda: torch.optim.RMSprop(_params()), {}, "'RMSprop'"),
        (lambda: torch.optim.LBFGS(_params()), {}, "'LBFGS'"),
        (lambda: torch.optim.Adam(_params()), {"impl": "fused"}, "impl='fused'"),
        (lambda: torch.optim.Adam(_params(), fused=True), {}, "fused=True"),
        (lambda: torch.optim.SGD(_params(), differentiable=True), {}, "differentiable=True"),
        (lambda: torch.optim.Adam(_params()), {"fullgraph": True}, "fullgraph=True"),
        (lambda: torch.optim.SGD(_params()), {"impl": "foreach_map"}, "'SGD'"),
    ],
)
def test_clear_errors(build, kwargs, match):
    with pytest.raises(UnsupportedOptimizerError, match=match) as info:
        compile_optimizer(build(), **kwargs)
    assert isinstance(info.value, ValueError)


def test_scheduler_of_another_optimizer_and_double_compile_are_errors():
    opt, other = torch.optim.Adam(_params()), torch.optim.Adam(_params())
    sched = torch.optim.lr_scheduler.StepLR(other, step_size=1)
    with pytest.raises(UnsupportedOptimizerError, match="not to this optimizer"):
        compile_optimizer(opt, scheduler=sched)
    compile_optimizer(opt, backend="eager")
    with pytest.raises(UnsupportedOptimizerError, match="already compiled"):
        compile_optimizer(opt, backend="eager")
    assert uncompile(opt) is opt  # undo: the class's eager step again
    assert "step" not in opt.__dict__ and not opt._optimizer_load_state_dict_post_hooks
    compile_optimizer(opt, backend="eager")


def test_uncompile_restores_the_eager_step_and_keeps_the_state():
    params = _params()
    opt = compile_optimizer(torch.optim.Adam(params, lr=torch.tensor(0.1)), backend="eager")
    for _ in range(3):
        for p in params:
            p.grad = torch.ones_like(p)
        opt.step()
    state = {k: v.clone() for k, v in opt.state[params[0]].items()}
    uncompile(opt)
    assert "step" not in opt.__dict__  # the class's step
    assert all(torch.equal(state[k], opt.state[params[0]][k]) for k in state)
    opt.step()  # eager, from the kept state
    assert int(opt.state[params[0]]["step"]) == 4


def test_a_misspelt_compile_keyword_is_refused_before_the_step_is_replaced():
    """compile_optimizer passes its other keywords to torch.compile: one torch.compile does not
    take is refused at the call, with the optimizer left as it was."""
    optimizer = torch.optim.AdamW(torch.nn.Linear(4, 2).parameters())
    with pytest.raises(TypeError, match=r"compile_optimizer: unexpected keyword bakend="):
        compile_optimizer(optimizer, bakend="eager")
    assert "step" not in optimizer.__dict__  # still torch's own step
    with pytest.raises(TypeError, match=r"verify='yes' must be True or False \(compare"):
        compile_optimizer(optimizer, verify="yes", backend="eager")


def _trainer_like_groups(model: torch.nn.Module) -> list[dict]:
    """HF Trainer's two groups (``get_decay_parameter_names``): decayed weights, and biases and
    norms without decay, empty for a LoRA model (no trainable bias or norm). A frozen parameter
    stays in its group, with no gradient."""
    return [
        {"params": list(model.parameters()), "weight_decay": 0.01},
        {"params": [], "weight_decay": 0.0},
    ]


@pytest.mark.parametrize("opt_name", ["adam", "adamw", "sgd_momentum"])
def test_an_empty_param_group_compiles_once_over_a_schedule(opt_name):
    """Regression: dynamo sets ``capturable=True`` in an empty group as it traces, and putting the
    user's value back after each step failed that guard at the next: a recompile per step until
    the limit (7 recompiles and a limit hit in 12 steps with Trainer's AdamW groups)."""
    model = _model()
    model[0].bias.requires_grad_(False)  # frozen, as a PEFT base model's
    opt = OPTIMIZERS[opt_name](_trainer_like_groups(model))
    sched = SCHEDULERS["hf_linear_warmup"](opt)
    counter = CompileCounterWithBackend("eager")
    compile_optimizer(opt, scheduler=sched, backend=counter)
    frames = _train(model, opt, sched, steps=STEPS, counter=counter)
    assert _recompiles(frames) == 0, frames
    assert [type(g.get("capturable", False)) for g in opt.param_groups] == [bool, bool]
    assert all(not g.get("capturable", False) for g in opt.param_groups)  # the user's value


def test_a_group_added_later_compiles_once_more_and_then_never():
    model = _model()
    opt = torch.optim.AdamW([{"params": model[0].parameters()}, {"params": []}], lr=0.01)
    counter = CompileCounterWithBackend("eager")
    compile_optimizer(opt, backend=counter)
    _train(model, opt, None, steps=3, counter=counter)
    opt.add_param_group({"params": model[2].parameters(), "lr": 0.001})
    frames = _train(model, opt, None, steps=STEPS, counter=counter)
    # the new group's first step runs eagerly (no state), its second compiles once; then none
    assert _recompiles(frames[1:]) == 0, frames


def test_verify_next_step_checks_a_later_step_and_restores_a_wrong_one():
    from miscompute import perturbed_updates

    from torchcompile_kit.errors import CompiledMismatchError
    from torchcompile_kit.optim import verify_next_step

    with pytest.raises(TypeError, match="was not compiled by compile_optimizer"):
        verify_next_step(torch.optim.SGD(_model().parameters(), lr=0.1))
    model = _model()
    opt = compile_optimizer(torch.optim.Adam(model.parameters(), lr=0.01), backend="eager")
    _train(model, opt, None, steps=3)
    verify_next_step(opt)
    _train(model, opt, None, steps=1)  # a healthy step passes and trains on
    wrong = _model()
    opt = compile_optimizer(
        torch.optim.Adam(wrong.parameters(), lr=0.01), backend=perturbed_updates
    )
    _train(wrong, opt, None, steps=3)  # unchecked: the compiled steps are wrong, silently
    wrong(_batch(3)).pow(2).mean().backward()
    before = [p.detach().clone() for p in wrong.parameters()]
    verify_next_step(opt)
    with pytest.raises(CompiledMismatchError, match="parameters and state were restored"):
        opt.step()
    for p, q in zip(wrong.parameters(), before):
        torch.testing.assert_close(p, q, rtol=0, atol=0)
