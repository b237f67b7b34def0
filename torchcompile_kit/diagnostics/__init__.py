"""What the compiler did, measured: recompile guards and eager-vs-compiled equivalence.

The topic's API. Modules: :mod:`.recompiles` (``no_recompiles``) and :mod:`.equivalence`
(``check_compile_equivalence``).
"""

from .equivalence import EquivalenceReport, TensorDiff, check_compile_equivalence
from .recompiles import no_recompiles

__all__ = [
    "EquivalenceReport",
    "TensorDiff",
    "check_compile_equivalence",
    "no_recompiles",
]
