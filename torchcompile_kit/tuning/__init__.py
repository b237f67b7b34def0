"""``tune``: on the user's own model and data, the fastest recipe that is still correct.

The topic's API. Modules: :mod:`.candidates` (the bench recipes tried, in order), :mod:`.arithmetic`
(predicted totals and break-even steps), :mod:`.runs` (each candidate in its own process, via the
bench's runner), :mod:`.gate` (the correctness check, in that process), :mod:`.budget` (time left,
and what budget would do more), :mod:`.ranking` (the recommendation),
:mod:`.tuner` (``tune`` itself), :mod:`.result` (what it found), :mod:`.report` and
:mod:`.snippet` (how it shows it), and
:mod:`.examples` (``--model`` factories: the tiny Llama-style decoder, the captioner).
"""


from .arithmetic import Cost, break_even_steps, predicted_total
from .candidates import CANDIDATES
from .ranking import rank_candidates
from .report import format_table, verification_line
from .result import CandidateResult, TuneResult
from .tuner import STEADY_S, tune

__all__ = [
    # top level UX
    "STEADY_S",
    "CandidateResult",
    "TuneResult",
    "format_table",
    "tune",
    "verification_line",
    # candidates and arithmetic
    "CANDIDATES",
    "Cost",
    "break_even_steps",
    "predicted_total",
    "rank_candidates",
]
