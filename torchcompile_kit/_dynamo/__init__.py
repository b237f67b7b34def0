"""The only door to torch's private compiler APIs.

Everything in torchcompile_kit that touches a private name of torch's compiler stack
(``torch._dynamo``, ``torch._inductor``, ``torch._higher_order_ops``, ``torch._logging``,
``torch._C``, ``nn.Module._compiled_call_impl``) goes through a function of this folder (one module per
concern; this ``__init__`` re-exports them all), so a torch release that moves one of them breaks
one module here, not twelve across the package. Each use says why it is needed, where
upstream it comes from, and when it can go. ``tests/test_layout.py`` fails if any other module of
the package names one of these.

Nothing here runs at import time beyond importing torch: every lookup happens when called, so a
missing name is a clear error (or a documented fallback) at the point of use.
"""

from __future__ import annotations

from .cache import (
    compile_cache_counters,
    cpu_capability,
    inductor_cache_dir,
    load_mega_cache,
    save_mega_cache,
)
from .counting import frame_counting_backend, recompile_limit_hits
from .hook_guards import with_module_hook_guards
from .inductor import fresh_inductor_cache, import_compiler, inductor_freezing_enabled
from .isa_probe import cpu_isa_probe_stats, start_cpu_isa_probe, wait_for_cpu_isa_probe
from .limits import (
    check_per_call_kwargs,
    isolated_cache_kwarg,
    recompile_limit,
    recompile_limit_kwarg,
)
from .marking import mark_dynamic, mark_static_address, reset
from .modules import (
    clear_compiled_call,
    compiled_module_names,
    eager_call,
    get_compiled_call,
    is_compiled_module,
    is_torch_compile_wrapper,
    set_compiled_call,
)
from .nested import mark_nested_region
from .optim import foreach_map_op, privateuse1_backend_name
from .paths import feature_paths
from .trace import (
    LIMIT_WARNING_LOGGER_NAME,
    TRACE_LOGGER_NAME,
    compilation_metrics_since,
    graph_break_counts,
    interned_string,
    limit_warning_logger,
    trace_logger,
)

__all__ = [
    "LIMIT_WARNING_LOGGER_NAME",
    "TRACE_LOGGER_NAME",
    "check_per_call_kwargs",
    "clear_compiled_call",
    "compilation_metrics_since",
    "compile_cache_counters",
    "compiled_module_names",
    "cpu_capability",
    "cpu_isa_probe_stats",
    "eager_call",
    "feature_paths",
    "foreach_map_op",
    "frame_counting_backend",
    "fresh_inductor_cache",
    "get_compiled_call",
    "graph_break_counts",
    "import_compiler",
    "inductor_cache_dir",
    "inductor_freezing_enabled",
    "interned_string",
    "is_compiled_module",
    "is_torch_compile_wrapper",
    "isolated_cache_kwarg",
    "limit_warning_logger",
    "load_mega_cache",
    "mark_dynamic",
    "mark_nested_region",
    "mark_static_address",
    "privateuse1_backend_name",
    "recompile_limit",
    "recompile_limit_hits",
    "recompile_limit_kwarg",
    "reset",
    "save_mega_cache",
    "set_compiled_call",
    "start_cpu_isa_probe",
    "trace_logger",
    "wait_for_cpu_isa_probe",
    "with_module_hook_guards",
]
