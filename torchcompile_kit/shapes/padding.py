"""Pad to bucket lengths (:func:`~torchcompile_kit.plan_buckets`): ``pad_to_bucket`` for sequences,
``PadToBucketCollator`` for a batch of feature dicts.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Literal

import torch

from .._checks import check_positive_int
from .._moved import refuses_moved
from ..errors import BatchShapeError, SequenceTooLongError
from .planner import bucket_for, check_buckets, round_up


def _as_1d(value: Any, where: str) -> torch.Tensor:
    """One sequence (int list or tensor) as a 1-D tensor, or a clear error naming ``where``."""
    if isinstance(value, torch.Tensor):
        tensor = value
    else:
        try:
            tensor = torch.as_tensor(value)
        except (TypeError, ValueError) as err:
            raise BatchShapeError(
                f"{where} is not a flat sequence of numbers ({err}); got {value!r:.80}"
            ) from err
        if tensor.numel() == 0:
            tensor = tensor.to(torch.long)
    if tensor.dim() != 1:
        raise BatchShapeError(
            f"{where} must be 1-D (one sequence), got shape "
            f"{tuple(tensor.shape)!r}; pass one list of token ids per sample"
        )
    return tensor


def _pad_stack(
    rows: list[torch.Tensor], length: int, pad_value: float, padding_side: str
) -> torch.Tensor:
    """Stack 1-D ``rows`` (each ``<= length``) into ``(len(rows), length)`` filled with pad."""
    dtype = rows[0].dtype
    out = torch.full((len(rows), length), pad_value, dtype=dtype)
    for index, row in enumerate(rows):
        n = row.numel()
        if n == 0:
            continue
        if padding_side == "right":
            out[index, :n] = row
        else:
            out[index, length - n :] = row
    return out


def _check_padding_side(padding_side: str) -> None:
    if padding_side not in ("right", "left"):
        raise BatchShapeError(f"padding_side must be 'right' or 'left', got {padding_side!r}")


def pad_to_bucket(
    sequences: Sequence[Sequence[int] | torch.Tensor],
    buckets: Sequence[int],
    *,
    pad_value: float = 0,
    padding_side: Literal["right", "left"] = "right",
) -> torch.Tensor:
    """Pad sequences to the smallest bucket that holds the longest one, as one tensor.

    Args:
        sequences: 1-D tensors or int lists (one per sample). Tensors keep their dtype (all must
            share it); lists become ``torch.long``.
        buckets: strictly ascending padding lengths, e.g. from :func:`plan_buckets`.
        pad_value: the value written into the padding.
        padding_side: ``"right"`` (pad after the tokens) or ``"left"`` (before them, as for
            batched generation with decoder-only models).

    Returns:
        A ``(len(sequences), bucket)`` tensor.

    Raises:
        SequenceTooLongError: a sequence is longer than the last bucket.
        ValueError: ``sequences`` is empty, a sequence is not 1-D, dtypes differ, or ``buckets``
            is not strictly ascending positive ints.

    Example:
        >>> pad_to_bucket([[1, 2, 3], [4]], [4, 8]).tolist()
        [[1, 2, 3, 0], [4, 0, 0, 0]]
    """
    buckets = check_buckets(buckets)
    _check_padding_side(padding_side)
    if len(sequences) == 0:
        raise BatchShapeError("sequences is empty; pass at least one sequence to pad")
    rows = [_as_1d(seq, f"sequences[{i}]") for i, seq in enumerate(sequences)]
    for index, row in enumerate(rows):
        if row.dtype != rows[0].dtype:
            raise BatchShapeError(
                f"sequences[{index}] has dtype {row.dtype!r} but sequences[0] "
                f"has {rows[0].dtype!r}; convert them to one dtype first"
            )
    index = max(range(len(rows)), key=lambda i: rows[i].numel())
    longest = rows[index].numel()
    length = bucket_for(longest, buckets)
    if length < 0:
        raise SequenceTooLongError(
            f"sequences[{index}] has length {longest!r}, longer than the "
            f"last bucket {buckets[-1]!r}; truncate it or plan buckets "
            "that cover it"
        )
    return _pad_stack(rows, length, pad_value, padding_side)


LABEL_PAD = -100
"""What ``labels`` are padded with: the ``ignore_index`` of torch's ``cross_entropy`` and of the
Hugging Face losses."""

# Keys padded as sequences, with the pad value each gets ("pad" = the pad token id, "label" =
# LABEL_PAD). Every sequence key of a batch is padded to the same (bucket) length.
_SEQUENCE_KEYS: dict[str, str | int] = {
    "input_ids": "pad",
    "attention_mask": 0,
    "token_type_ids": 0,
    "position_ids": 0,
    "special_tokens_mask": 1,
    "labels": "label",
    "decoder_input_ids": "pad",
    "decoder_attention_mask": 0,
}
# key -> the key whose per-sample length it must match
_SAME_LENGTH_AS = {
    "attention_mask": "input_ids",
    "token_type_ids": "input_ids",
    "position_ids": "input_ids",
    "special_tokens_mask": "input_ids",
    "decoder_attention_mask": "decoder_input_ids",
}


def _is_sequence_value(value: Any) -> bool:
    if isinstance(value, torch.Tensor):
        return value.dim() >= 1
    return isinstance(value, (list, tuple))


class PadToBucketCollator:
    """A ``collate_fn`` / HF ``data_collator`` that pads every batch to a bucket length.

    The sequence keys (``input_ids``, ``attention_mask``, ``labels``, ``decoder_*``, ...) are padded
    to the smallest bucket holding the batch's longest sequence (with ``buckets=None``: that length
    rounded up to ``multiple_of``); ``labels`` with -100 (:data:`LABEL_PAD`), and ``attention_mask``
    is built when absent. Other keys are stacked when they can be, else passed through as lists.

    Args:
        buckets: strictly ascending padding lengths (:func:`plan_buckets`); ``None`` pads to a
            multiple of ``multiple_of``.
        multiple_of: with ``buckets=None``, pad to a multiple of this.
        pad_token_id: pad value of ``input_ids`` / ``decoder_input_ids``.
        padding_side: ``"right"`` or ``"left"``.
        max_length: truncate longer samples (every sequence key alike); ``None``: a sample longer
            than the last bucket is an error.

    Raises:
        ValueError: bad arguments, or no pad token id.

    With an HF tokenizer, pass ``pad_token_id=tokenizer.pad_token_id,
    padding_side=tokenizer.padding_side``.

    Example:
        >>> collate = PadToBucketCollator(buckets=[8, 16], pad_token_id=0)
        >>> batch = collate([{"input_ids": [5, 6, 7], "labels": [5, 6, 7]},
        ...                  {"input_ids": [8], "labels": [8]}])
        >>> batch["input_ids"].shape, batch["labels"][1].tolist()[:3]
        (torch.Size([2, 8]), [8, -100, -100])
    """

    @refuses_moved
    def __init__(
        self,
        *,
        buckets: Sequence[int] | None = None,
        multiple_of: int = 8,
        pad_token_id: int | None = 0,
        padding_side: Literal["right", "left"] = "right",
        max_length: int | None = None,
    ) -> None:
        self.buckets = None if buckets is None else check_buckets(buckets)
        self.multiple_of = check_positive_int("multiple_of", multiple_of, error=BatchShapeError)
        if pad_token_id is None:
            raise BatchShapeError(
                "pad_token_id=None: 'input_ids'/'decoder_input_ids' cannot be "
                "padded; pass the tokenizer's pad id (pad_token_id=tokenizer.pad_token_id); a "
                "tokenizer without one needs tokenizer.pad_token = tokenizer.eos_token (causal "
                "LMs) or a pad token added"
            )
        _check_padding_side(padding_side)
        if max_length is not None:
            check_positive_int("max_length", max_length, error=BatchShapeError)
            if self.buckets is not None and max_length > self.buckets[-1]:
                raise BatchShapeError(
                    f"max_length={max_length!r} exceeds the last bucket "
                    f"{self.buckets[-1]!r}: samples up to max_length would fit "
                    f"no bucket; pass max_length<={self.buckets[-1]} or add a "
                    f"bucket >= {max_length}"
                )
        self.pad_token_id = pad_token_id
        self.padding_side = padding_side
        self.max_length = max_length

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(buckets={self.buckets!r}, "
            f"multiple_of={self.multiple_of!r}, pad_token_id={self.pad_token_id!r}, "
            f"padding_side={self.padding_side!r}, max_length={self.max_length!r})"
        )

    def target_length(self, longest: int) -> int:
        """The length a batch whose longest (truncated) sequence is ``longest`` pads to, or
        ``SequenceTooLongError`` past the last bucket.

        Example:
            >>> PadToBucketCollator(buckets=[16, 64]).target_length(17)
            64
        """
        if self.buckets is not None:
            length = bucket_for(max(longest, 1), self.buckets)
            if length < 0:
                raise SequenceTooLongError(
                    f"a sequence of length {longest!r} is longer than the "
                    f"last bucket {self.buckets[-1]!r}"
                )
            return length
        length = round_up(max(longest, 1), self.multiple_of)
        return length if self.max_length is None else min(length, self.max_length)

    def batch_shapes(
        self, features: Sequence[Mapping[str, Any]], batch_size: int, *, drop_last: bool = False
    ) -> list[tuple[int, int]]:
        """The distinct ``(batch size, padded length)`` shapes of batches of ``batch_size``
        consecutive samples: what a loader without shuffling (an evaluation loader) feeds, for
        :func:`~torchcompile_kit.expect_shapes`. Reads each sample's sequence lengths (a
        ``datasets.Dataset`` column by column), collates nothing.

        Args:
            features: the dataset, one mapping per sample (as given to this collator).
            batch_size: samples per batch.
            drop_last: the loader drops a last partial batch.

        Returns:
            The shapes in the order first met.

        Example:
            >>> rows = [{"input_ids": [1] * n} for n in (3, 9, 4, 20, 5)]
            >>> PadToBucketCollator(buckets=[8, 16, 32]).batch_shapes(rows, 2)
            [(2, 16), (2, 32), (1, 8)]
        """
        check_positive_int("batch_size", batch_size, error=BatchShapeError)
        lengths = self._sample_lengths(features)
        ends = range(batch_size, len(lengths) + (0 if drop_last else batch_size), batch_size)
        shapes = {}
        for end in ends:
            batch = lengths[end - batch_size : end]
            shapes.setdefault((len(batch), self.target_length(max(batch))), None)
        return list(shapes)

    def _sample_lengths(self, features: Sequence[Mapping[str, Any]]) -> list[int]:
        """Each sample's longest sequence key (truncated to ``max_length``)."""
        columns = getattr(features, "column_names", None)
        if columns is not None:  # a datasets.Dataset: a column at a time, not a dict per row
            keys = [key for key in columns if key in _SEQUENCE_KEYS]
            per_key = [[len(value) for value in features[key]] for key in keys]
            lengths = [max(row) for row in zip(*per_key)] if per_key else []
        else:
            lengths = [
                max(
                    (
                        len(value)
                        for key, value in feature.items()
                        if key in _SEQUENCE_KEYS and _is_sequence_value(value)
                    ),
                    default=0,
                )
                for feature in features
            ]
        if self.max_length is not None:
            lengths = [min(length, self.max_length) for length in lengths]
        if not lengths or not max(lengths):
            raise BatchShapeError(
                "batch_shapes: the samples hold no sequence key "
                f"({', '.join(_SEQUENCE_KEYS)}); nothing to pad"
            )
        return lengths

    def __call__(self, features: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
        """Collate one mapping per sample into a padded batch (tensors, and lists for keys that
        cannot be stacked); errors name the key and the sample's index.

        Example:
            >>> PadToBucketCollator(multiple_of=4)([{"input_ids": [1, 2, 3, 4, 5]}])["input_ids"]
            tensor([[1, 2, 3, 4, 5, 0, 0, 0]])
        """
        if len(features) == 0:
            raise BatchShapeError("features is empty: a batch needs at least one sample")
        keys = list(features[0].keys())
        for index, feature in enumerate(features):
            if set(feature.keys()) != set(keys):
                missing = sorted(set(keys) - set(feature.keys()))
                extra = sorted(set(feature.keys()) - set(keys))
                raise BatchShapeError(
                    f"features[{index}] has different keys from features[0]: "
                    f"missing {missing!r}, extra {extra!r}; every sample of a "
                    "batch needs the same keys"
                )
        sequence_keys = [
            k for k in keys if k in _SEQUENCE_KEYS and _is_sequence_value(features[0][k])
        ]
        rows = {key: self._rows(features, key) for key in sequence_keys}
        self._check_lengths(rows)
        if "input_ids" in rows and "attention_mask" not in rows:
            rows["attention_mask"] = [
                torch.ones_like(r, dtype=torch.long) for r in rows["input_ids"]
            ]
        longest = max((r.numel() for key_rows in rows.values() for r in key_rows), default=0)
        length = self._length_or_raise(rows, longest)
        batch: dict[str, Any] = {}
        for key in keys:
            if key not in rows:
                batch[key] = _stack_or_list([f[key] for f in features], key)
        for key, key_rows in rows.items():
            batch[key] = _pad_stack(key_rows, length, self._pad_value(key), self.padding_side)
        return batch

    def _rows(self, features: Sequence[Mapping[str, Any]], key: str) -> list[torch.Tensor]:
        rows = []
        for index, feature in enumerate(features):
            value = feature[key]
            if not _is_sequence_value(value):
                raise BatchShapeError(
                    f"features[{index}][{key!r}] is {value!r:.60}, but "
                    f"features[0][{key!r}] is a sequence; give every sample the "
                    "same kind of value"
                )
            row = _as_1d(value, f"features[{index}][{key!r}]")
            if self.max_length is not None:
                row = row[: self.max_length]
            rows.append(row)
        return rows

    @staticmethod
    def _check_lengths(rows: dict[str, list[torch.Tensor]]) -> None:
        for key, reference in _SAME_LENGTH_AS.items():
            if key not in rows or reference not in rows:
                continue
            for index, (row, ref) in enumerate(zip(rows[key], rows[reference])):
                if row.numel() != ref.numel():
                    raise BatchShapeError(
                        f"features[{index}][{key!r}] has length {row.numel()!r} "
                        f"but features[{index}][{reference!r}] has "
                        f"{ref.numel()!r}; they must match"
                    )

    def _length_or_raise(self, rows: dict[str, list[torch.Tensor]], longest: int) -> int:
        try:
            return self.target_length(longest)
        except SequenceTooLongError:
            key, index = next(
                (key, i)
                for key, key_rows in rows.items()
                for i, r in enumerate(key_rows)
                if r.numel() == longest
            )
            raise SequenceTooLongError(
                f"features[{index}][{key!r}] has length {longest!r}, "
                f"longer than the last bucket {self.buckets[-1]!r}; pass "
                f"max_length={self.buckets[-1]} to truncate, filter such "
                "samples out, or plan buckets that cover them"
            ) from None

    def _pad_value(self, key: str) -> int:
        spec = _SEQUENCE_KEYS[key]
        if spec == "pad":
            return self.pad_token_id
        if spec == "label":
            return LABEL_PAD
        return spec


def _stack_or_list(values: list[Any], key: str) -> Any:
    """Same-shaped tensors/numbers/number lists as one tensor; anything else as a list."""
    first = values[0]
    if isinstance(first, torch.Tensor):
        for index, value in enumerate(values):
            if not isinstance(value, torch.Tensor) or value.shape != first.shape:
                shape = tuple(value.shape) if isinstance(value, torch.Tensor) else type(value)
                raise BatchShapeError(
                    f"features[{index}][{key!r}] has shape {shape!r} but "
                    f"features[0][{key!r}] has {tuple(first.shape)!r}; "
                    "non-sequence keys are stacked and must match"
                )
        return torch.stack(values)
    if isinstance(first, (bool, int, float)) or (
        isinstance(first, (list, tuple)) and all(isinstance(v, (int, float)) for v in first)
    ):
        try:
            return torch.tensor(values)
        except (TypeError, ValueError) as err:
            raise BatchShapeError(
                f"features[*][{key!r}] cannot be stacked ({err}); give every "
                "sample the same shape for this key, or drop it before "
                "collating"
            ) from err
    return values
