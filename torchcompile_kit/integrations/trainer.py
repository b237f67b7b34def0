"""HF ``Trainer`` with a regionally compiled model: bucket loader, compiled optimizer, compile logs
(:class:`CompileTrainerMixin`; docs/integrations.md says why each is an override, not a callback).
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import warnings
from typing import Any, Literal

from .. import _dynamo
from ..cache import CompileCacheSession, resolve_keys, resolve_path
from ..cache import compile_cache as cache_session
from ..diagnostics import CompileMonitor
from ..errors import BatchShapeError, UnsupportedOptimizerError
from ..optim import compile_optimizer
from ..regional import get_regional_plan
from ..shapes import BucketBatchSampler
from .accelerate import check_sharding, shard_once

__all__ = ["CompileTrainerMixin"]  # and CompileTrainer, built on first access (__getattr__)

_LOG_PREFIX = "compile/"
logger = logging.getLogger(__name__)


class CompileTrainerMixin:
    """Mix into ``transformers.Trainer`` (first base) for bucketed, compiled, observed training.

    Args:
        *args: passed to ``Trainer``.
        train_batch_sampler: a :class:`~torchcompile_kit.BucketBatchSampler` over ``train_dataset``
            (``num_replicas=None``: it shards exactly once on any number of processes), with
            ``data_collator=PadToBucketCollator(...)``. ``None``: Trainer's own loader.
        compile_optimizer_kwargs: how Trainer's optimizer is compiled with
            :func:`~torchcompile_kit.compile_optimizer`. ``None`` (default): ``{}`` when it can be
            compiled, else eager with a warning (Trainer's default ``adamw_torch_fused`` is already
            one kernel); a dict: compile with it, or raise; ``False``: leave it eager.
        compile_monitor: log the ``compile/*`` figures of a ``CompileMonitor`` counted while
            ``train`` runs (:attr:`monitor`); ``False`` to skip.
        compile_cache: a path or fsspec URL for :func:`~torchcompile_kit.compile_cache`: ``train``
            loads it before the first step and saves on exit, also when training raises
            (:attr:`compile_cache_session`). ``None`` (default): no cache.
        compile_cache_key: the key that signs the cache and that a load requires (``key=`` of
            ``compile_cache``); ``None``: ``$TORCHCOMPILE_KIT_CACHE_KEY``, if set.
        **kwargs: passed to ``Trainer``.

    Raises:
        ValueError: ``args.torch_compile`` is set and the model is regionally compiled.
        BatchShapeError: ``train_batch_sampler`` is not a ``BucketBatchSampler`` or was built for
            another number of processes.
        TypeError: ``compile_optimizer_kwargs`` is not a dict, ``None`` or ``False``.

    Example:
        >>> trainer = CompileTrainer(model=compile_regional(model), args=args,
        ...     train_dataset=ds, data_collator=PadToBucketCollator(buckets=buckets),
        ...     train_batch_sampler=BucketBatchSampler(lengths, buckets, batch_size=8),
        ... )  # doctest: +SKIP
        >>> trainer.train()  # doctest: +SKIP
    """

    def __init__(self, *args: Any, train_batch_sampler: BucketBatchSampler | None = None,
                 compile_optimizer_kwargs: dict[str, Any] | Literal[False] | None = None,
                 compile_monitor: bool = True, compile_cache: str | os.PathLike[str] | None = None,
                 compile_cache_key: str | bytes | None = None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        _refuse_whole_model_compile(self.args, self.model)
        if train_batch_sampler is not None:
            if not isinstance(train_batch_sampler, BucketBatchSampler):
                raise BatchShapeError("train_batch_sampler must be a BucketBatchSampler, got "
                                      f"{type(train_batch_sampler).__name__!r}; for another "
                                      "sampler override get_train_dataloader")
            check_sharding(train_batch_sampler, self.args.world_size)
        self.train_batch_sampler = train_batch_sampler
        if compile_optimizer_kwargs is not None and compile_optimizer_kwargs is not False:
            if not isinstance(compile_optimizer_kwargs, dict):
                raise TypeError("compile_optimizer_kwargs must be a dict, None (compile if "
                                "possible) or False (keep the optimizer eager), got "
                                f"{compile_optimizer_kwargs!r}")
        self.compile_optimizer_kwargs = compile_optimizer_kwargs
        self._compiled_optimizer: Any = None
        self.monitor: CompileMonitor | None = CompileMonitor() if compile_monitor else None
        if compile_cache is not None:  # a wrong path is refused here, not at train()
            resolve_path(compile_cache, caller="CompileTrainer(compile_cache=...)")
        self.compile_cache = None if compile_cache is None else os.fspath(compile_cache)
        if compile_cache_key is not None:  # a key of the wrong type is refused here, not at train()
            resolve_keys(compile_cache_key, caller="CompileTrainer(compile_cache_key=...)")
        self._compile_cache_key = compile_cache_key
        self.compile_cache_session: CompileCacheSession | None = None

    # -- data ------------------------------------------------------------------------------

    def get_train_dataloader(self) -> Any:
        """Trainer's train loader with the bucket sampler as ``batch_sampler`` (if one was given).

        Returns:
            The loader, prepared by Trainer's accelerator.
        """
        if self.train_batch_sampler is None:
            return super().get_train_dataloader()
        from torch.utils.data import DataLoader
        from transformers.trainer_utils import seed_worker
        from transformers.utils import is_datasets_available

        dataset, collator = self.train_dataset, self.data_collator
        # Trainer._get_dataloader's column handling, which it keeps private
        if is_datasets_available():
            import datasets

            if isinstance(dataset, datasets.Dataset):
                dataset = self._remove_unused_columns(dataset, description="Training")
            else:
                collator = self._get_collator_with_removed_columns(collator, "Training")
        else:
            collator = self._get_collator_with_removed_columns(collator, "Training")
        args = self.args
        loader = DataLoader(
            dataset,
            batch_sampler=self.train_batch_sampler,
            collate_fn=collator,
            num_workers=args.dataloader_num_workers,
            pin_memory=args.dataloader_pin_memory,
            persistent_workers=args.dataloader_persistent_workers,
            prefetch_factor=args.dataloader_prefetch_factor,
            multiprocessing_context=args.dataloader_multiprocessing_context,
            in_order=args.dataloader_in_order,
            worker_init_fn=functools.partial(
                seed_worker, num_workers=args.dataloader_num_workers, rank=args.process_index
            ),
        )
        return shard_once(self.accelerator.prepare(loader), self.train_batch_sampler)

    # -- optimizer -------------------------------------------------------------------------

    def create_optimizer(self, *args: Any, **kwargs: Any) -> Any:
        """Trainer's optimizer, compiled once unless ``compile_optimizer_kwargs=False``; one that cannot
        be compiled stays eager with a warning, or raises when the kwargs were a dict."""
        optimizer = super().create_optimizer(*args, **kwargs)
        options = self.compile_optimizer_kwargs
        if options is False or optimizer is self._compiled_optimizer:
            return optimizer
        name = type(getattr(optimizer, "optimizer", optimizer)).__name__
        try:
            compile_optimizer(optimizer, **({} if options is None else options))
        except UnsupportedOptimizerError as err:
            if options is not None:
                raise
            warnings.warn(f"CompileTrainer kept the {name} optimizer eager: {err} (or pass "
                          "compile_optimizer_kwargs=False to keep it eager without this warning)",
                          stacklevel=2)
            return optimizer
        logger.info("CompileTrainer compiled the %s optimizer with compile_optimizer(%s)", name,
                    ", ".join(f"{k}={v!r}" for k, v in (options or {}).items()))
        self._compiled_optimizer = optimizer
        return optimizer

    # -- observation -----------------------------------------------------------------------

    def train(self, *args: Any, **kwargs: Any) -> Any:
        """``Trainer.train`` inside the compile cache (when given), with the monitor running.

        Returns:
            Trainer's ``TrainOutput``.
        """
        with contextlib.ExitStack() as stack:
            if self.compile_cache is not None:
                self.compile_cache_session = stack.enter_context(
                    cache_session(self.compile_cache, key=self._compile_cache_key))
                logger.info("CompileTrainer: %s", self.compile_cache_session.loaded.summary())
            if self.monitor is not None:
                stack.enter_context(self.monitor)
            return super().train(*args, **kwargs)

    def log(self, logs: dict[str, float], *args: Any, **kwargs: Any) -> None:
        """Add the compile figures to ``logs``, then log as Trainer does (every consumer sees them).

        Args:
            logs: the values to log.
            *args: passed on (``start_time``).
            **kwargs: passed on.
        """
        if self.monitor is not None:
            for key, value in self.monitor.snapshot().items():
                if isinstance(value, (int, float)):
                    logs[_LOG_PREFIX + key] = value
        super().log(logs, *args, **kwargs)


def _refuse_whole_model_compile(args: Any, model: Any) -> None:
    if not getattr(args, "torch_compile", False) or model is None:
        return
    if get_regional_plan(model) is not None or _dynamo.compiled_module_names(model):
        raise ValueError("TrainingArguments(torch_compile=True) on a regionally compiled "
                         f"{type(model).__name__}: accelerate would torch.compile the whole model "
                         "and the blocks' own graphs would never run (more graphs, graph breaks, "
                         "slower). Pass TrainingArguments(torch_compile=False) and keep "
                         "compile_regional(model, ...) (put torch_compile_backend/mode into "
                         "compile_regional's keyword arguments).")


def __getattr__(name: str) -> Any:
    # CompileTrainer subclasses transformers.Trainer: built on first use, so importing this
    # module does not import transformers.
    if name == "CompileTrainer":
        from transformers import Trainer

        cls = type(
            "CompileTrainer",
            (CompileTrainerMixin, Trainer),
            {"__doc__": "``transformers.Trainer`` with :class:`CompileTrainerMixin`.",
             "__module__": __name__},
        )
        globals()[name] = cls
        return cls
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
