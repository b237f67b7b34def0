"""How each run is measured: the one settings object ``bench`` (every row) and ``tune`` (every
candidate) hand to the runner, recorded with their results."""

from __future__ import annotations

import os
from dataclasses import asdict, dataclass
from typing import Any

from .captioner import PRESETS

__all__ = ["MeasureConfig"]


@dataclass(kw_only=True, frozen=True, slots=True)
class MeasureConfig:
    """The measurement settings of one ``bench`` or ``tune`` run (checked when built).

    Example:
        >>> MeasureConfig(preset="tiny", steps=50).steps_or_preset()
        50
        >>> MeasureConfig(steps=0)  # doctest: +NORMALIZE_WHITESPACE
        Traceback (most recent call last):
        ValueError: MeasureConfig(steps=0): must be a positive number of steps, or None for the
        preset's
    """

    preset: str = "tiny"
    """The captioner's sizes (``"tiny"`` or ``"full-size"``) and default step counts; with a
    ``--model`` spec only the step counts."""
    backend: str | None = None
    """``torch.compile`` backend of every compile (``None``: ``$TORCHCOMPILE_KIT_BENCH_BACKEND``
    or ``"inductor"``); ``"eager"``/``"aot_eager"`` make tests cheap."""
    steps: int | None = None
    """Steady steps to time after the warm-up (``None``: the preset's)."""
    warmup_steps: int | None = None
    """Steps timed as warm-up from the cold start (``None``: the preset's)."""
    steady_s: float = 0.0
    """Time steady steps for at least this many seconds (more than ``steps`` when they are
    fast), so the mean covers a stretch of the machine's time; ``0``: just ``steps``."""
    paired: bool = True
    """An eager copy of the model steps beside each compiled run in alternating blocks, so its
    ratio to eager holds when the machine's load changes (:mod:`.paired`)."""
    device: str | None = None
    """``"cpu"`` or ``"cuda"`` (the local rank's GPU) for every row (``None``:
    ``$TORCHCOMPILE_KIT_BENCH_DEVICE``, else CUDA when a GPU is visible, else the CPU)."""
    pin: str | None = None
    """``"TRAIN:COMPILE"`` CPU lists (``"0:1"``, ``"0,1:2,3"``): every row trains on the TRAIN
    CPUs with as many torch threads, and a background compile's worker runs on the COMPILE ones
    (a GPU machine's idle CPU); ``None``: all CPUs for everything."""

    def __post_init__(self) -> None:
        if self.preset not in PRESETS:
            raise ValueError(
                f"MeasureConfig(preset={self.preset!r}): choose from {list(PRESETS)!r}"
            )
        for name in ("steps", "warmup_steps"):
            value = getattr(self, name)
            if value is not None and (
                isinstance(value, bool) or not isinstance(value, int) or value < 1
            ):
                raise ValueError(
                    f"MeasureConfig({name}={value!r}): must be a positive number of "
                    "steps, or None for the preset's"
                )
        if self.device not in (None, "cpu", "cuda"):
            raise ValueError(
                f"MeasureConfig(device={self.device!r}): choose 'cpu' or 'cuda', or "
                "None for CUDA when a GPU is visible"
            )
        if not self.steady_s >= 0:
            raise ValueError(f"MeasureConfig(steady_s={self.steady_s!r}): must be >= 0 seconds")
        if self.pin is not None:
            self.pinned_cpus()

    def pinned_cpus(self) -> tuple[list[int], list[int]] | None:
        """``pin`` as ``(train CPUs, compile CPUs)``, or ``ValueError`` for a malformed one.

        Example:
            >>> MeasureConfig(pin="0:1").pinned_cpus()  # doctest: +NORMALIZE_WHITESPACE
            ([0], [1])
        """
        if self.pin is None:
            return None
        try:
            train, compile_ = (
                sorted({int(c) for c in side.split(",")}) for side in self.pin.split(":")
            )
        except ValueError:
            train = compile_ = []
        if not train or not compile_ or set(train) & set(compile_):
            raise ValueError(
                f"MeasureConfig(pin={self.pin!r}): pass TRAIN:COMPILE CPU lists that "
                "do not overlap, e.g. '0:1' (train on CPU 0, compile on CPU 1)"
            )
        return train, compile_

    def backend_or_default(self) -> str:
        """``backend``, else ``$TORCHCOMPILE_KIT_BENCH_BACKEND``, else ``"inductor"``."""
        return self.backend or os.environ.get("TORCHCOMPILE_KIT_BENCH_BACKEND") or "inductor"

    def device_or_default(self) -> str:
        """``device``, else ``$TORCHCOMPILE_KIT_BENCH_DEVICE``, else ``"cuda"`` when a GPU is
        visible, else ``"cpu"``; ``ValueError`` for CUDA asked on a machine without it."""
        import torch

        device = (
            self.device
            or os.environ.get("TORCHCOMPILE_KIT_BENCH_DEVICE")
            or ("cuda" if torch.cuda.is_available() else "cpu")
        )
        if device not in ("cpu", "cuda"):
            raise ValueError(f"$TORCHCOMPILE_KIT_BENCH_DEVICE={device!r}: choose 'cpu' or 'cuda'")
        if device == "cuda" and not torch.cuda.is_available():
            raise ValueError(
                "device 'cuda' asked for, and torch sees no CUDA device here "
                f"(torch {torch.__version__}, CUDA {torch.version.cuda}); drop it to "
                "run on the CPU"
            )
        return device

    def steps_or_preset(self) -> int:
        """``steps``, or the preset's."""
        return self.steps or PRESETS[self.preset].steps

    def warmup_steps_or_preset(self) -> int:
        """``warmup_steps``, or the preset's."""
        return self.warmup_steps or PRESETS[self.preset].warmup_steps

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready fields (recorded in ``results.json`` and ``tune.json``)."""
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> MeasureConfig:
        """Rebuild from :meth:`as_dict` data (other keys, e.g. the rest of ``tune.json``'s
        settings, are ignored)."""
        return cls(**{name: data[name] for name in cls.__dataclass_fields__ if name in data})
