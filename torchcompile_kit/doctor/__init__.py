"""The doctor: when ``torch.compile`` crashes or miscomputes, where and why (experimental).

The topic's API: :func:`diagnose` and its records. ``torchcompile-kit doctor`` runs it.
"""

from .diagnose import diagnose
from .recompiles import RecompileFinding, explain_recompile
from .record import EXIT_CODES, RESULTS, Diagnosis, Trial, TrialKind, TrialOutcome

__all__ = [
    "EXIT_CODES",
    "RESULTS",
    "Diagnosis",
    "RecompileFinding",
    "Trial",
    "TrialKind",
    "TrialOutcome",
    "diagnose",
    "explain_recompile",
]
