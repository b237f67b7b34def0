"""The doctor: when ``torch.compile`` crashes or miscomputes, where and why (experimental).

The topic's API: :func:`diagnose` and its records. ``torchcompile-kit doctor`` runs it.
"""

from .diagnose import diagnose
from .record import RESULTS, Diagnosis, Trial, TrialOutcome

__all__ = ["RESULTS", "Diagnosis", "Trial", "TrialOutcome", "diagnose"]
