"""Dynamo backends that compile a wrong graph on purpose, for the first-call check's tests.

A backend is ``(gm, example_inputs) -> callable``. These run the graph as ``aot_eager`` does
(through AOTAutograd, so training and nested regions work) and add 1e-2 to every floating-point
output of the forward graph (``perturbed_forward``: outputs and, through saved activations,
gradients differ) or of the backward graph (``perturbed_backward``: only gradients differ).
"""

from __future__ import annotations

import torch
from torch._dynamo.backends.common import aot_autograd
from torch._functorch.aot_autograd import make_boxed_func

SHIFT = 1e-2


def _shifted_by(amount: float):
    def compile_graph(gm: torch.fx.GraphModule, example_inputs):
        def run(*args):
            out = gm(*args)
            shift = lambda t: (
                t + amount if isinstance(t, torch.Tensor) and t.is_floating_point() else t
            )
            return (
                type(out)(shift(t) for t in out) if isinstance(out, (tuple, list)) else shift(out)
            )

        return make_boxed_func(run)

    return compile_graph


_shifted = _shifted_by(SHIFT)


def _exact(gm: torch.fx.GraphModule, example_inputs):
    return make_boxed_func(gm)


perturbed_forward = aot_autograd(fw_compiler=_shifted, bw_compiler=_exact)
perturbed_backward = aot_autograd(fw_compiler=_exact, bw_compiler=_shifted)
# 1e-6 on the forward's outputs: beyond float32 rounding of O(1) values, within its fixed tolerance
slightly_shifted = aot_autograd(fw_compiler=_shifted_by(1e-6), bw_compiler=_exact)


def perturbed_updates(gm: torch.fx.GraphModule, example_inputs):
    """Runs the graph, then adds 1e-2 in place to each floating-point tensor with a dim that the
    graph holds as an attribute: an optimizer step's parameters and state (dynamo installs them on
    the graph) come out wrong."""

    def run(*args):
        out = gm(*args)
        with torch.no_grad():
            for tensor in [*gm.parameters(), *gm.buffers()]:
                if tensor.is_floating_point() and tensor.dim() > 0:
                    tensor.add_(SHIFT)
        return out

    return run


def scaled_dropout_output(graph: torch.fx.Graph) -> None:
    """An inductor pre-grad pass (``torch._inductor.config.pre_grad_custom_pass``) that multiplies
    each dropout's output by 1.01: a miscompute inside inductor itself (``backend="inductor"``),
    next to the random numbers. On a LoRA model whose B is zero (peft's initialisation) the outputs
    stay equal and only the ``lora_B`` gradients go wrong, through the dropout's mask."""
    import operator

    for node in list(graph.nodes):
        if node.op == "call_function" and node.target is torch.nn.functional.dropout:
            with graph.inserting_after(node):
                scaled = graph.call_function(operator.mul, (node, 1.01))
            node.replace_all_uses_with(scaled, delete_user_cb=lambda user, s=scaled: user is not s)
