"""Compiled optimizers: a step that does not recompile when the learning rate changes.

The topic's API. Modules: :mod:`.compiled` (``compile_optimizer``, ``zero_grads``) and
:mod:`.foreach_adam` (the horizontally fused Adam/AdamW update on ``foreach_map``).
"""

from .compiled import compile_optimizer, zero_grads
from .foreach_adam import foreach_map_adam_step

__all__ = [
    "compile_optimizer",
    "foreach_map_adam_step",
    "zero_grads",
]
