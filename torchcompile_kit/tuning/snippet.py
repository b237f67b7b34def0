"""The ready-to-paste code that applies a recommended recipe: the user's ``--model`` factory (from
any directory), the very lines the bench ran (:func:`~torchcompile_kit.bench.setup_source`), a loop.
"""

from __future__ import annotations

from ..bench import SEQUENCE_KEYS, Recipe, setup_source

__all__ = ["make_snippet"]


def make_snippet(
    recipe: Recipe,
    *,
    spec: str,
    backend: str = "inductor",
    fullgraph: bool = True,
    steps_planned: int,
    batch_size: int | None = None,
    sys_path: str | None = None,
    spec_optimizer: bool = False,
) -> str:
    """Python source that sets up ``recipe`` on the user's ``spec`` factory and trains for
    ``steps_planned`` steps when run as a script.

    The setup is :func:`~torchcompile_kit.bench.setup_source` (the lines the bench ran);
    ``sys_path`` is the directory the factory imports from; ``spec_optimizer``: train with the
    factory's own optimizer instead of ``Adam(lr=1e-4)``; ``fullgraph``: the measured run had no
    graph break.

    Example:
        >>> from torchcompile_kit.bench import RECIPES
        >>> print(make_snippet(RECIPES["eager"], spec="mypkg.models:build", steps_planned=10))
        ... # doctest: +NORMALIZE_WHITESPACE, +ELLIPSIS
        import torch
        ...
    """
    module, _, function = spec.rpartition(":")
    overrides = (
        {"fullgraph": fullgraph} if recipe.compile != "none" and recipe.world_size == 1 else {}
    )
    setup = setup_source(recipe, backend=backend, overrides=overrides)
    head = ["import torch"]
    if recipe.mark_dynamic or recipe.cache_from:
        names = ["mark_dynamic_batch"] * recipe.mark_dynamic + ["compile_cache"] * bool(
            recipe.cache_from
        )
        head.append(f"from torchcompile_kit import {', '.join(names)}")
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
        f"# recipe chosen by `torchcompile-kit tune`: {recipe.name} ({recipe.description})",
        f"{unpack} = {function}()",
    ]
    if not spec_optimizer:
        body += [
            (
                "# the optimizer tune measured; return yours from the factory to keep it "
                "(docs/tune.md)"
            ),
            "optimizer = torch.optim.Adam(model.parameters(), lr=1e-4)",
        ]
    body += [*setup, "", "", "def train_step(batch):"]
    if recipe.mark_dynamic:
        body.append(f"    keys = [k for k in {SEQUENCE_KEYS!r} if k in batch]")
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
    if recipe.data == "buckets":
        size = batch_size or 64
        body += [
            "# bucket recipe: your dataset (samples of token ids) and their lengths:",
            "# from torchcompile_kit import (Batching, BucketBatchSampler, PadToBucketCollator,",
            "#                               plan_buckets)",
            f"# batching = Batching({size}, drop_last=True)",
            "# buckets = plan_buckets(lengths, max_buckets=8, batching=batching)",
            f"# sampler = BucketBatchSampler(lengths, buckets, {size}, drop_last=True)",
            "# loader = torch.utils.data.DataLoader(dataset, batch_sampler=sampler,",
            (
                "#                                      "
                "collate_fn=PadToBucketCollator(buckets=buckets))"
            ),
            "# warm every bucket shape up front (warmup_shapes), then train on `loader`",
        ]
        # make_batch's batches are not bucketed: a dynamic=False model would recompile on them
        loop = [
            "pass  # with `loader` built as above:",
            "# for step, batch in zip(range(steps_planned), loader):",
            "#     train_step(batch)",
        ]
    if recipe.cache_from:
        loop = [
            "with compile_cache('compile-cache'):  # saved at exit, loaded by the next restart",
            *("    " + line for line in loop),
        ]
    # run as a script it trains; imported (or exec'd with another __name__) it only sets up
    loop = ['if __name__ == "__main__":', *("    " + line for line in loop)]
    return "\n".join(head + body + loop) + "\n"
