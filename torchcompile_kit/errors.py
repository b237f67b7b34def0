"""Exceptions raised by torchcompile_kit: each a :class:`TorchCompileKitError` and the built-in
users expect (``ValueError`` for bad input, ``RuntimeError`` while running).
"""

from __future__ import annotations

__all__ = [
    "BatchShapeError",
    "BlockSelectorError",
    "CompileCacheWarning",
    "CompiledMismatchError",
    "NoRepeatedBlocksError",
    "SequenceTooLongError",
    "SignatureRefused",
    "TorchCompileKitError",
    "UnexpectedRecompileError",
    "UnsafeAdapterConfigError",
    "UnsafeCompileModeError",
    "UnsupportedOptimizerError",
    "UnsupportedTorchError",
]


class TorchCompileKitError(Exception):
    """Base class of every error raised by torchcompile_kit."""


class NoRepeatedBlocksError(TorchCompileKitError, ValueError):
    """``compile_regional`` found no block class with two or more instances to compile."""


class BlockSelectorError(TorchCompileKitError, ValueError):
    """A ``blocks=`` selector is malformed or matches no module."""


class SequenceTooLongError(TorchCompileKitError, ValueError):
    """A sample is longer than the largest bucket (or ``max_length``)."""


class UnsupportedOptimizerError(TorchCompileKitError, ValueError):
    """The optimizer, or one of its options, cannot be compiled by ``compile_optimizer``."""


class UnsafeAdapterConfigError(TorchCompileKitError, ValueError):
    """A PEFT configuration is known to break or silently miscompute under ``torch.compile``."""


class UnsafeCompileModeError(TorchCompileKitError, ValueError):
    """A compile mode measured to compute wrong results in this setting is refused."""


class UnexpectedRecompileError(TorchCompileKitError, RuntimeError):
    """A compiled function would recompile inside a ``no_recompiles()`` block."""


class UnsupportedTorchError(TorchCompileKitError, RuntimeError):
    """An argument or feature needs a newer torch than the one installed (the message names it)."""


class BatchShapeError(TorchCompileKitError, ValueError):
    """A length, bucket, batch or dynamic-dim argument cannot be honoured (buckets, dynamic)."""


class CompiledMismatchError(TorchCompileKitError, RuntimeError):
    """A recipe's first compiled call computed something else than eager on the same batch.

    Raised by the first-call check of ``compile_regional``, ``compile_model``, ``compile_peft``
    and ``compile_optimizer`` (``verify=``) before the call returns; the message names the recipe,
    the torch version, the backend and the largest difference. ``record`` is the
    ``FirstCallCheck`` (also in a running ``CompileMonitor``'s ``first_call_checks``).
    """

    def __init__(self, message: str, *, record: object = None) -> None:
        super().__init__(message)
        self.record = record


class SignatureRefused(TorchCompileKitError, ValueError):
    """A key was set and a file the library would load (a compile cache, a background compile's
    hand-off) is unsigned, signed with another key, or was changed after it was signed. A compile
    cache refused for it is a ``CompileCacheWarning`` and a cold compile, not this error."""


class CompileCacheWarning(UserWarning):
    """A compile cache (or a region's entry in it) was not loaded or saved: corrupt, truncated,
    built in another environment, or for another model. A warning, not an error: a cache that
    cannot be used costs a compile, never the run."""
