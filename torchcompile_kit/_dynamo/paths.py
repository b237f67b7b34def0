"""Which path each version-dependent entry of this folder takes on the running torch (printed by
every CI run; docs/architecture.md, "Version honesty"). Only entries whose path differs inside the
window are listed (docs/architecture.md, "Raising a floor").
"""

from __future__ import annotations

import torch

from .limits import isolated_cache_kwarg, recompile_limit_kwarg

__all__ = ["feature_paths"]


def feature_paths() -> dict[str, str]:
    """Each version-dependent entry and the path it takes on this torch, in words.

    Example:
        >>> feature_paths()["per-call recompile_limit"]  # doctest: +SKIP
        'torch.compile(recompile_limit=)'
    """
    return {
        "torch": torch.__version__,
        "per-call recompile_limit": "torch.compile(recompile_limit=)"
        if recompile_limit_kwarg()
        else "refused by name; preflight warns instead",
        "isolated regions": "torch.compile(isolate_recompiles=)"
        if isolated_cache_kwarg()
        else "shared budget (explain_graph_breaks says so)",
    }
