"""Shapes without recompiles: few bucket lengths, batches padded to them, dims marked dynamic.

The topic's API (``no_recompiles`` lives in ``torchcompile_kit.diagnostics``).
"""

from .dynamic import mark_dynamic_batch, warmup_shapes
from .padding import PadToBucketCollator, pad_to_bucket
from .planner import Batching, estimate_padding, plan_buckets
from .sampler import BucketBatchSampler

__all__ = [
    # planning
    "Batching",
    "estimate_padding",
    "plan_buckets",
    # batching
    "BucketBatchSampler",
    "PadToBucketCollator",
    "pad_to_bucket",
    # dynamic dims and warm-up
    "mark_dynamic_batch",
    "warmup_shapes",
]
