"""``tune``: on the user's own model and data, the fastest recipe that is still correct.

The topic's API; :mod:`.tuner` is the entry point and its docstring names the other modules.
"""

from .arithmetic import Cost, break_even_steps, predicted_total
from .candidates import CANDIDATES
from .ranking import rank_candidates
from .report import format_table, prediction_line, save_result
from .result import CandidateResult, PredictionCheck, TuneResult
from .tuner import STEADY_S, check_prediction, tune

__all__ = [
    # top level UX
    "STEADY_S",
    "CandidateResult",
    "PredictionCheck",
    "TuneResult",
    "check_prediction",
    "format_table",
    "tune",
    "prediction_line",
    "save_result",
    # candidates and arithmetic
    "CANDIDATES",
    "Cost",
    "break_even_steps",
    "predicted_total",
    "rank_candidates",
]
