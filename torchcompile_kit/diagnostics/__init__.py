"""What the compiler did, measured: compile events, graph breaks, recompile guards, equivalence.

The topic's API. Modules: :mod:`.monitor` (``CompileMonitor``), :mod:`.explain`
(``explain_graph_breaks``), :mod:`.recompiles` (``no_recompiles``) and :mod:`.equivalence`
(``check_compile_equivalence``). :mod:`.trace_records` (the record's data classes and the readers
of torch's texts) and :mod:`.recorder` (the trace handler) serve the monitor.
"""

from .equivalence import EquivalenceReport, EquivalenceStep, TensorDiff, check_compile_equivalence
from .explain import explain_graph_breaks
from .monitor import CompileMonitor
from .recompiles import allow_first_compile, no_recompiles
from .trace_records import CompiledFrame, GraphBreak, LimitHit, Recompile

__all__ = [
    # top level UX
    "CompileMonitor",
    "check_compile_equivalence",
    "explain_graph_breaks",
    "no_recompiles",
    # the records
    "CompiledFrame",
    "EquivalenceReport",
    "EquivalenceStep",
    "GraphBreak",
    "LimitHit",
    "Recompile",
    "TensorDiff",
    # for other topics (not in torchcompile_kit.__all__): compile_optimizer's first compile
    "allow_first_compile",
]
