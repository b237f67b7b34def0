"""What the compiler did, measured: compile events, graph breaks, recompile guards, equivalence.

The topic's API: ``CompileMonitor``, ``explain_graph_breaks``, ``no_recompiles``,
``check_compile_equivalence`` and the first-call checks the fragile recipes run (``verify=``).
"""

from .comparator import TensorDiff, leaves
from .equivalence import (
    EquivalenceReport,
    EquivalenceStep,
    check_compile_equivalence,
    note_ran_eagerly,
)
from .explain import explain_graph_breaks, explaining
from .first_call import FirstCallVerifier
from .in_place_check import check_in_place_update
from .monitor import CompileMonitor, first_call_checks_made, note_running_monitors
from .recompiles import allow_first_compile, no_recompiles
from .regions import (
    CompileFailure,
    compile_failure,
    current_region,
    grad_modes,
    mark_call,
    mark_region,
    set_recompile_limit,
    was_called,
)
from .trace_records import (
    CompileCounts,
    CompiledFrame,
    FirstCallCheck,
    GraphBreak,
    LimitHit,
    MonitorRecord,
    Recompile,
)

__all__ = [
    # top level UX
    "CompileMonitor",
    "check_compile_equivalence",
    "explain_graph_breaks",
    "no_recompiles",
    # the records
    "CompileCounts",
    "CompiledFrame",
    "MonitorRecord",
    "EquivalenceReport",
    "EquivalenceStep",
    "FirstCallCheck",
    "GraphBreak",
    "LimitHit",
    "Recompile",
    "TensorDiff",
    # for other topics (not in torchcompile_kit.__all__): compile_optimizer's first compile
    "allow_first_compile",
    # for other topics: a compiled region whose compiles the monitor attributes to it, and the
    # compile that raised in it (the regional report names it), and the recompile limit its calls
    # compile under
    "CompileFailure",
    "compile_failure",
    "current_region",
    "grad_modes",
    "mark_call",
    "mark_region",
    "set_recompile_limit",
    "was_called",
    # for other topics: explain_graph_breaks is tracing (the regional recipe's own warning waits)
    "explaining",
    # for other topics: a compiled call run eagerly on purpose (a KV cache), which a running
    # check_compile_equivalence must not count as compared
    "note_ran_eagerly",
    # for other topics: an event a recipe reports to the running monitors (a background switch)
    "note_running_monitors",
    # for other topics: the checks a background worker made, for the training process
    "first_call_checks_made",
    # for the recipes' verify=: the first-call check (the flag's one meaning: _checks.FLAGS)
    "FirstCallVerifier",
    "check_in_place_update",
    # for other topics (the doctor's repro): the tensors of a nested output, in order
    "leaves",
]
