"""Regional compilation: compile the repeated blocks of a model once, not the whole model.

The topic's API.
"""

from .background import (
    BackgroundCompile,
    BackgroundState,
    compile_in_background,
    get_background_compile,
)
from .compile import compile_in_place, compile_model, compile_regional, uncompile
from .discovery import find_repeated_blocks
from .expected_shapes import expect_shapes
from .plan import BlockGroup, CompiledGroup, ExpectedShapes, RegionalPlan, get_regional_plan
from .transformers_support import cache_calls_compiled, fix_loss_function, has_transformers_model

__all__ = [
    # top level UX
    "compile_in_background",
    "compile_model",
    "compile_regional",
    "expect_shapes",
    "find_repeated_blocks",
    "fix_loss_function",
    "get_regional_plan",
    "uncompile",
    # the plan, and a background compile's options and record
    "BackgroundCompile",
    "BackgroundState",
    "BlockGroup",
    "CompiledGroup",
    "ExpectedShapes",
    "get_background_compile",
    "RegionalPlan",
    # for helpers that compile next to a regional compile (compile_peft, integrations)
    "cache_calls_compiled",
    "compile_in_place",
    "has_transformers_model",
]
