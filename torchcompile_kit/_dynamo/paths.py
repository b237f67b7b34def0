"""Which path each entry of this folder takes on the running torch (printed by every CI run).

Part of the one door to torch's private compiler APIs (see ``_dynamo/__init__.py``); the table
in docs/architecture.md ("Version honesty") is these lines from the CI runs of the window.
"""

from __future__ import annotations

import torch

from .cache import has_mega_cache
from .hook_guards import has_module_hook_guard_switch
from .inductor import _fresh_cache_fn
from .isa_probe import _isa_probe_fn
from .limits import _limit_name, isolated_cache_kwarg, recompile_limit_kwarg
from .nested import has_nested_compile_region
from .optim import foreach_map_op
from .trace import trace_logger

__all__ = ["feature_paths"]


def feature_paths() -> dict[str, str]:
    """Each version-dependent entry and the path it takes on this torch, in words.

    Example:
        >>> feature_paths()["nested regions"]  # doctest: +SKIP
        'torch.compiler.nested_compile_region'
    """
    fresh = _fresh_cache_fn()
    return {
        "torch": torch.__version__,
        "no_recompiles": "torch.compiler.set_stance"
        if hasattr(torch.compiler, "set_stance")
        else "refused (needs set_stance)",
        "recompile limit": f"torch._dynamo.config.{_limit_name()}",
        "per-call recompile_limit": "torch.compile(recompile_limit=)"
        if recompile_limit_kwarg()
        else "refused by name; preflight warns instead",
        "isolated regions": "torch.compile(isolate_recompiles=)"
        if isolated_cache_kwarg()
        else "shared budget (explain_graph_breaks says so)",
        "nested regions": "torch.compiler.nested_compile_region"
        if has_nested_compile_region()
        else "blocks compiled one by one, with a warning",
        "foreach_map": "torch._higher_order_ops.foreach_map"
        if foreach_map_op() is not None
        else "_foreach_* Adam, with a warning",
        "mega-cache": "torch.compiler.save/load_cache_artifacts"
        if has_mega_cache()
        else "kernels only",
        "ISA probe": "started early"
        if _isa_probe_fn() is not None
        else "inductor's own, at the first kernel",
        "hook guards": "skip_nnmodule_hook_guards switched per call"
        if has_module_hook_guard_switch()
        else "none (older torch)",
        "monitor source": "structured trace"
        if trace_logger() is not None
        else "compilation metrics",
        "cold inductor cache": f"torch._inductor.utils.{fresh.__name__}"
        if fresh is not None
        else "TORCHINDUCTOR_CACHE_DIR",
    }

