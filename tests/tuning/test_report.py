"""The lines tune prints beside its table: the bucket note and the prediction-check line."""

from __future__ import annotations

import random

from torchcompile_kit.bench import PRESETS, spec_buckets
from torchcompile_kit.tuning import PredictionCheck, prediction_line
from torchcompile_kit.tuning.report import bucket_notes
from torchcompile_kit.tuning.result import Steadiness


def test_the_bucket_note_says_what_the_timed_buckets_row_padded_to():
    rng = random.Random(0)
    lengths = [rng.randint(5, 31) for _ in range(900)] + [rng.randint(65, 255) for _ in range(100)]
    measured = spec_buckets(lengths, PRESETS["tiny"])
    assert len(measured) <= PRESETS["tiny"].max_buckets and max(measured) >= max(lengths)
    (note,) = bucket_notes(lengths, 64, measured)
    assert f"smallest of {measured} that fits" in note and "no sampler groups lengths" in note
    (plain,) = bucket_notes(lengths, 64)
    assert "timed 'buckets' row" not in plain and plain in note
    assert bucket_notes(None, 64, measured) == []


def test_the_prediction_line_carries_steadiness_and_steal():
    line = prediction_line(
        PredictionCheck(
            status="ok",
            recipe="buckets",
            steps=20000,
            predicted_s=474.3,
            measured_s=507.0,
            ratio=474.3 / 507.0,
            steadiness=Steadiness(steady=True, window_ms=[25.1], note="the run kept its speed"),
            cpu_steal=0.002,
        )
    )
    assert "predicted 474.3 s, measured 507.0 s (predicted ÷ measured 0.94)" in line
    assert "the run kept its speed" in line and "took 0% of the CPU time" in line
    assert (
        prediction_line(PredictionCheck(status="failed", error="boom"))
        == "prediction check: failed: boom"
    )


def test_the_chart_is_drawn_on_a_private_figure_without_touching_pyplot(tmp_path):
    """tune() runs inside the user's process: its chart must not pick matplotlib's
    backend for them."""
    import subprocess
    import sys

    code = f"""
import sys
from torchcompile_kit.tuning.report import write_chart
from torchcompile_kit.bench import Speedup
from torchcompile_kit.tuning.result import CandidateResult, TuneResult
chosen = CandidateResult(name="regional", description="", status="ok", verdict="pass", step_s=0.1,
                         compile_s=30.0, speedup=Speedup(ratio=1.5, low=1.4, high=1.6, paired=True))
eager = CandidateResult(name="eager", description="", status="ok", verdict="eager", step_s=0.15)
result = TuneResult(recommendation="regional", reason="", snippet="", steps_planned=1000,
                    candidates=[chosen, eager])
path = write_chart(result, {str(tmp_path / "tune.png")!r})
print(path, "matplotlib.pyplot" in sys.modules)
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    path, pyplot_imported = out.stdout.rsplit(maxsplit=1)  # the path may hold spaces
    assert (tmp_path / "tune.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and path.endswith(
        "tune.png"
    )
    assert pyplot_imported == "False"


def test_a_tune_json_written_before_the_grouped_speedup_still_loads():
    from torchcompile_kit.bench import Speedup
    from torchcompile_kit.tuning import CandidateResult

    old = {"name": "full", "description": "", "status": "ok", "speedup": 1.2}
    old.update(speedup_low=1.1, speedup_high=1.3, paired=True, graphs=1)
    loaded = CandidateResult.from_dict(old)
    assert loaded.speedup == Speedup(ratio=1.2, low=1.1, high=1.3, paired=True)
    assert loaded.paired
