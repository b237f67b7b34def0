"""What a diagnosis costs on a ~6-block model (a script, not a test).

    python -m tests.doctor.measure_cost OUT_DIR   (from the repository root)

A six-layer GPT-2 (hidden 64, ReLU MLPs, built from its config) on a batch of 4 x 16 tokens,
compiled whole with inductor and inductor's own planted accuracy bug in every ReLU kernel
(``cpp.inject_relu_bug_TESTING_ONLY="accuracy"``): every stage runs (triage, determinism, ladder,
settings, the descent to ``transformer.h.*.mlp.act``, the confirmation, torch's bisector, the
repro). Prints one JSON line: the torch, the result, the culprit, the trials (and how many
compiled with inductor), the seconds, the notes (what this torch lacks). docs/troubleshooting.md
quotes it.
"""

from __future__ import annotations

import json
import sys
import time

import torch

from tests.doctor.patients import gpt2
from torchcompile_kit.doctor import TrialKind, diagnose


def build():
    return gpt2(layers=6, width=64, activation="relu", rows=4)


def main(out: str) -> None:
    start = time.perf_counter()
    diagnosis = diagnose(
        "tests.doctor.measure_cost:build",
        backend="inductor",
        options={"cpp.inject_relu_bug_TESTING_ONLY": "accuracy"},
        out=out,
    )
    inductor = [t for t in diagnosis.trials if t.kind != TrialKind.LADDER]
    print(diagnosis.summary(), file=sys.stderr)
    print(
        json.dumps(
            {
                "torch": torch.__version__,
                "device": diagnosis.device,
                "result": diagnosis.result,
                "first_bad_backend": diagnosis.first_bad_backend,
                "culprits": diagnosis.culprits,
                "confirmed": diagnosis.culprit_confirmed,
                "bisect": diagnosis.bisect,
                "repro_fails": diagnosis.repro_fails,
                "trials": len(diagnosis.trials),
                "inductor_trials": len(inductor),
                "seconds": round(time.perf_counter() - start),
                "notes": diagnosis.notes,
            }
        )
    )


if __name__ == "__main__":
    main(sys.argv[1])
