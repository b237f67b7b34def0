"""The ready-to-paste code that applies a recommended candidate with this library's helpers.

The snippet builds the model and batches from the user's own ``--model`` factory (so it runs as
printed, from any directory: it puts the directory ``tune`` imported the factory's module from on
``sys.path``, or loads a file spec by its absolute path), applies the recipe exactly as ``tune``
measured it (the bench recipe's calls, written out) with the factory's own optimizer when it
returns one, and trains for the planned steps. ``fullgraph=True`` is written only when the
measured run had no graph break.
"""

from __future__ import annotations

from .candidates import Candidate

__all__ = ["make_snippet"]

_SEQ_KEYS = (
    "input_ids",
    "attention_mask",
    "labels",
    "token_type_ids",
    "position_ids",
    "decoder_input_ids",
    "decoder_attention_mask",
)


def make_snippet(
    candidate: Candidate,
    *,
    spec: str,
    backend: str = "inductor",
    fullgraph: bool = True,
    steps_planned: int,
    batch_size: int | None = None,
    transformers_model: bool = False,
    sys_path: str | None = None,
    spec_optimizer: bool = False,
) -> str:
    """Python source that sets up ``candidate``'s recipe on the user's model and trains.

    Args:
        candidate: the recommended candidate.
        spec: the ``"module:function"`` factory (``--model``); file paths are loaded by path
            (pass an absolute one for a script that runs from anywhere).
        backend: the ``torch.compile`` backend (written only when not ``"inductor"``).
        fullgraph: write ``fullgraph=True`` (the measured run had no graph break).
        steps_planned: the number of steps the loop runs.
        batch_size: the sampler's batch size for the bucket recipe.
        transformers_model: the model contains a transformers model: pin its loss first
            (``fix_loss_function``), as the recipe did.
        sys_path: the directory the factory's module imports from
            (``bench.portable_model_spec``); the snippet inserts it into ``sys.path``.
        spec_optimizer: the factory returns its optimizer as a fourth item: the snippet trains
            with it (compiled or fused as the candidate says) instead of ``Adam(lr=1e-4)``.

    Returns:
        The source; it defines ``model``, ``optimizer``, ``make_batch`` and ``train_step``, and
        trains for ``steps_planned`` steps when run as a script (``__name__ == "__main__"``).

    Example:
        >>> from torchcompile_kit.tuning.candidates import CANDIDATES
        >>> print(make_snippet(CANDIDATES[0], spec="mypkg.models:build", steps_planned=10))
        ... # doctest: +ELLIPSIS
        import torch
        ...
    """
    module, _, function = spec.rpartition(":")
    kw = "" if backend == "inductor" else f", backend={backend!r}"
    full_kw = f"fullgraph={fullgraph}{kw}"
    imports = {"mark_dynamic_batch"} if candidate.dynamic == "mark" else set()
    lines: list[str] = []
    if candidate.kind == "full" or candidate.kind == "buckets":
        dynamic = ", dynamic=False" if candidate.dynamic == "static" else ""
        if transformers_model:
            imports.add("fix_loss_function")
            lines.append("fix_loss_function(model)  # pins the loss: no graph break there")
        lines.append(f"model.compile({full_kw}{dynamic})")
    elif candidate.kind in ("regional", "nested"):
        imports.add("compile_regional")
        if candidate.kind == "regional":
            if transformers_model:
                imports.add("fix_loss_function")
                lines.append(f"fix_loss_function(model, compile=True, {full_kw})")
            lines.append(f"compile_regional(model, {full_kw})")
        else:
            lines += [f"compile_regional(model, nested=True, {full_kw})"]
    if spec_optimizer:  # the factory's own optimizer, as the measured run used it
        if candidate.optimizer == "compiled":
            imports.add("compile_optimizer")
            lines.append(f"optimizer = compile_optimizer(optimizer{kw})  # its step compiled")
        elif candidate.optimizer == "fused":
            lines += [
                "# your Adam/AdamW rebuilt with fused=True: same param groups and hyperparameters",
                "optimizer = type(optimizer)(",
                "    [{k: v for k, v in g.items() if k not in ('foreach', 'fused')}",
                "     for g in optimizer.param_groups],",
                "    fused=True,",
                ")",
            ]
    else:
        lines.append(
            "# the optimizer tune measured; return yours from the factory to keep it (docs/tune.md)"
        )
        if candidate.optimizer == "compiled":
            imports.add("compile_optimizer")
            lines.append(
                f"optimizer = compile_optimizer(torch.optim.Adam(model.parameters(), lr=1e-4){kw})"
            )
        elif candidate.optimizer == "fused":
            lines.append("optimizer = torch.optim.Adam(model.parameters(), lr=1e-4, fused=True)")
        else:
            lines.append("optimizer = torch.optim.Adam(model.parameters(), lr=1e-4)")
    if candidate.restart:
        imports.add("compile_cache")
    head = ["import torch"]
    if imports:
        head.append(f"from torchcompile_kit import {', '.join(sorted(imports))}")
    if module.endswith(".py") or "/" in module:
        head += [
            "import importlib.util",
            f"_spec = importlib.util.spec_from_file_location('user_model', {module!r})",
            "_module = importlib.util.module_from_spec(_spec)",
            "_spec.loader.exec_module(_module)",
            f"{function} = _module.{function}",
        ]
    else:
        if sys_path is not None:
            head += [
                "import sys",
                "",
                f"_MODEL_DIR = {sys_path!r}  # where tune imported {module!r} from",
                "if _MODEL_DIR not in sys.path:  # so this script runs from any directory",
                "    sys.path.insert(0, _MODEL_DIR)",
            ]
        head.append(f"from {module} import {function}")
    unpack = "model, make_batch, _, optimizer" if spec_optimizer else "model, make_batch, *_"
    body = [
        "",
        f"# recipe chosen by `torchcompile-kit tune`: {candidate.name} ({candidate.description})",
        f"{unpack} = {function}()",
        *lines,
        "",
        "",
        "def train_step(batch):",
    ]
    if candidate.dynamic == "mark":
        body.append(f"    keys = [k for k in {_SEQ_KEYS!r} if k in batch]")
        body.append("    batch = mark_dynamic_batch(batch, 1, keys=keys)  # one dynamic graph")
    body += [
        "    optimizer.zero_grad(set_to_none=True)",
        "    out = model(**batch)",
        "    loss = out['loss'] if isinstance(out, dict) else getattr(out, 'loss', out)",
        "    loss.backward()",
        "    optimizer.step()",
        "    return loss.detach()",
        "",
        "",
        f"steps_planned = {steps_planned}",
    ]
    loop = ["for step in range(steps_planned):", "    train_step(make_batch(step))"]
    if candidate.kind == "buckets":
        size = batch_size or 64
        body += [
            "# bucket recipe: your dataset (samples of token ids) and their lengths:",
            "# from torchcompile_kit import BucketBatchSampler, PadToBucketCollator, plan_buckets",
            f"# buckets = plan_buckets(lengths, max_buckets=8, batch_size={size}, drop_last=True)",
            f"# sampler = BucketBatchSampler(lengths, buckets, {size}, drop_last=True)",
            "# loader = torch.utils.data.DataLoader(dataset, batch_sampler=sampler,",
            "#                                      collate_fn=PadToBucketCollator(buckets=buckets))",
            "# warm every bucket shape up front (warmup_shapes), then train on `loader`",
        ]
        # make_batch's batches are not bucketed: a dynamic=False model would recompile on them
        loop = [
            "pass  # with `loader` built as above:",
            "# for step, batch in zip(range(steps_planned), loader):",
            "#     train_step(batch)",
        ]
    if candidate.restart:
        loop = [
            "with compile_cache('compile-cache'):  # saved at exit, loaded by the next restart",
            *("    " + line for line in loop),
        ]
    # run as a script it trains; imported (or exec'd with another __name__) it only sets up
    loop = ['if __name__ == "__main__":', *("    " + line for line in loop)]
    return "\n".join(head + body + loop) + "\n"
