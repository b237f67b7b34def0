"""Compiled optimizers: a step that does not recompile when the learning rate changes.

The topic's API. Modules: :mod:`.compiled` (``compile_optimizer``), :mod:`.foreach_adam` (the
horizontally fused Adam/AdamW update on ``foreach_map``) and :mod:`.grads`
(``zero_grads_in_place``).
"""

from .compiled import compile_optimizer, verify_next_step
from .foreach_adam import foreach_map_adam_step
from .grads import zero_grads_in_place

__all__ = [
    "compile_optimizer",
    "foreach_map_adam_step",
    "zero_grads_in_place",
    # for tune's gate: the first-step check, on a later step of a run's optimizer
    "verify_next_step",
]
