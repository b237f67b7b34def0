"""The repro script: the culprit compiled alone on the saved weights and batch, judged against
eager, failing (exit 1) while the problem reproduces."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

__all__ = ["write_repro"]

_SCRIPT = '''"""doctor repro: {result}{differs} with backend={backend!r} when {where} is compiled
(torch {torch}, {device}). Run: python {name}  (exit 1 while it reproduces, 0 once fixed)."""

import json
import platform
import sys

import torch

from torchcompile_kit.doctor.trial import run_trial

REQUEST = json.loads({request!r})

print(f"torch {{torch.__version__}}, python {{platform.python_version()}}, {{platform.machine()}}")
outcome = run_trial(REQUEST)
print(json.dumps(outcome, indent=1))
sys.exit(1 if outcome["status"] not in ("ok", "eager-error") else 0)
'''


def write_repro(folder: Path, request: dict[str, Any], diagnosis: Any) -> Path:
    """Write ``folder/doctor_repro.py`` for ``request`` (a trial request, paths inside ``folder``).

    Example:
        >>> write_repro(Path("out"), request, diagnosis)  # doctest: +SKIP
        PosixPath('out/doctor_repro.py')
    """
    path = folder / "doctor_repro.py"
    trial = request["trial"]
    where = ", ".join(trial["modules"] or ["the whole model"])
    path.write_text(
        _SCRIPT.format(
            result=diagnosis.result,
            differs=f" ({', '.join(diagnosis.differs)})" if diagnosis.differs else "",
            backend=trial["backend"],
            where=where[:200],
            torch=diagnosis.torch,
            device=diagnosis.device,
            name=path.name,
            request=json.dumps(request),
        )
    )
    return path
