"""HF ``Trainer`` with a regionally compiled model: bucket loader, compiled optimizer, compile logs
(:class:`CompileTrainerMixin`; docs/integrations.md says why each is an override, not a callback).
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import warnings
from collections.abc import Mapping
from types import MappingProxyType
from typing import Any

from .. import _dynamo
from ..cache import CompileCacheSession, resolve_keys, resolve_path
from ..cache import compile_cache as cache_session
from ..diagnostics import CompileMonitor
from ..errors import BatchShapeError, UnsupportedOptimizerError
from ..optim import compile_optimizer
from ..regional import expect_shapes, get_regional_plan
from ..shapes import BucketBatchSampler, PadToBucketCollator
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
        compile_optimizer_kwargs: the arguments Trainer's optimizer is compiled with
            (:func:`~torchcompile_kit.compile_optimizer`; default: none, its defaults); an
            optimizer that cannot be compiled stays eager with a warning (Trainer's default
            ``adamw_torch_fused`` is already one kernel). ``None``: leave it eager.
        compile_monitor: log the ``compile/*`` figures of a ``CompileMonitor`` that records
            while ``train``, ``evaluate`` and ``predict`` run (:attr:`monitor`); each
            ``evaluate``/``predict`` call logs the figures of its own monitor
            (:attr:`eval_monitor`, the last call's). ``False`` to skip.
        compile_cache: a path or fsspec URL for :func:`~torchcompile_kit.compile_cache`: ``train``
            loads it before the first step and saves on exit, also when training raises
            (:attr:`compile_cache_session`). ``None`` (default): no cache.
        compile_cache_key: the key that signs the cache and that a load requires (``key=`` of
            ``compile_cache``); ``None``: ``$TORCHCOMPILE_KIT_CACHE_KEY``, if set.
        **kwargs: passed to ``Trainer``.

    With a ``compile_regional`` model, the plan is told the shapes the run feeds before the first
    step (:func:`~torchcompile_kit.expect_shapes`): the sampler's batch shapes in training and,
    with ``PadToBucketCollator``, the evaluation batches' shapes (each evaluation dataset, in the
    evaluation loader's order), so the recompile limits hold every graph of both modes and the
    plan's report predicts them.

    Raises:
        ValueError: ``args.torch_compile`` is set and the model is regionally compiled.
        BatchShapeError: ``train_batch_sampler`` is not a ``BucketBatchSampler`` or was built for
            another number of processes.
        TypeError: ``compile_optimizer_kwargs`` is not a mapping or ``None``.

    Example:
        >>> trainer = CompileTrainer(model=compile_regional(model), args=args,
        ...     train_dataset=ds, data_collator=PadToBucketCollator(buckets=buckets),
        ...     train_batch_sampler=BucketBatchSampler(lengths, buckets, batch_size=8),
        ... )  # doctest: +SKIP
        >>> trainer.train()  # doctest: +SKIP
    """

    def __init__(
        self,
        *args: Any,
        train_batch_sampler: BucketBatchSampler | None = None,
        compile_optimizer_kwargs: Mapping[str, Any] | None = MappingProxyType({}),
        compile_monitor: bool = True,
        compile_cache: str | os.PathLike[str] | None = None,
        compile_cache_key: str | bytes | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(*args, **kwargs)
        _refuse_whole_model_compile(self.args, self.model)
        if train_batch_sampler is not None:
            if not isinstance(train_batch_sampler, BucketBatchSampler):
                raise BatchShapeError(
                    "train_batch_sampler must be a BucketBatchSampler, got "
                    f"{type(train_batch_sampler).__name__!r}; for another "
                    "sampler override get_train_dataloader"
                )
            check_sharding(train_batch_sampler, self.args.world_size)
        self.train_batch_sampler = train_batch_sampler
        if not isinstance(compile_optimizer_kwargs, (Mapping, type(None))):
            raise TypeError(
                "compile_optimizer_kwargs must be a dict of compile_optimizer's arguments ({} "
                "for its defaults) or None (keep the optimizer eager), got "
                f"{compile_optimizer_kwargs!r}"
            )
        self.compile_optimizer_kwargs = compile_optimizer_kwargs
        self._compiled_optimizer: Any = None
        self.monitor: CompileMonitor | None = CompileMonitor() if compile_monitor else None
        self.eval_monitor: CompileMonitor | None = None
        self._call_monitor: CompileMonitor | None = None  # the evaluate()/predict() running now
        if compile_cache is not None:  # a wrong path is refused here, not at train()
            resolve_path(compile_cache, caller="CompileTrainer(compile_cache=...)")
        self.compile_cache = None if compile_cache is None else os.fspath(compile_cache)
        if compile_cache_key is not None:  # a key of the wrong type is refused here, not at train()
            resolve_keys(compile_cache_key, caller="CompileTrainer(compile_cache_key=...)")
        self._compile_cache_key = compile_cache_key
        self.compile_cache_session: CompileCacheSession | None = None
        if self._regional() and train_batch_sampler is not None:
            expect_shapes(self.model, train_batch_sampler, mode="train")
        self._expect_eval_shapes(self.eval_dataset)

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
        """Trainer's optimizer, compiled once unless ``compile_optimizer_kwargs=None``; one that
        cannot be compiled stays eager with a warning."""
        optimizer = super().create_optimizer(*args, **kwargs)
        options = self.compile_optimizer_kwargs
        if options is None or optimizer is self._compiled_optimizer:
            return optimizer
        name = type(getattr(optimizer, "optimizer", optimizer)).__name__
        try:
            compile_optimizer(optimizer, **options)
        except UnsupportedOptimizerError as err:
            warnings.warn(
                f"CompileTrainer kept the {name} optimizer eager: {err} (or pass "
                "compile_optimizer_kwargs=None to keep it eager without this warning)",
                stacklevel=2,
            )
            return optimizer
        logger.info(
            "CompileTrainer compiled the %s optimizer with compile_optimizer(%s)",
            name,
            ", ".join(f"{k}={v!r}" for k, v in options.items()),
        )
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
                    cache_session(self.compile_cache, key=self._compile_cache_key)
                )
                logger.info("CompileTrainer: %s", self.compile_cache_session.loaded.summary())
            if self.monitor is not None:
                stack.enter_context(self.monitor)
            return super().train(*args, **kwargs)

    def evaluate(self, *args: Any, **kwargs: Any) -> Any:
        """``Trainer.evaluate`` with its batch shapes told to the plan and its own monitor.

        Returns:
            Trainer's metrics dict; its ``compile/*`` figures are this call's.
        """
        dataset = kwargs.get("eval_dataset", args[0] if args else None)
        return self._observed(super().evaluate, dataset, *args, **kwargs)

    def predict(self, *args: Any, **kwargs: Any) -> Any:
        """``Trainer.predict`` with its batch shapes told to the plan and its own monitor.

        Returns:
            Trainer's ``PredictionOutput``; its metrics' ``compile/*`` figures are this call's
            (:attr:`eval_monitor`).
        """
        dataset = kwargs.get("test_dataset", args[0] if args else None)
        return self._observed(super().predict, dataset, *args, **kwargs)

    def _observed(self, call: Any, dataset: Any, *args: Any, **kwargs: Any) -> Any:
        if isinstance(dataset, str) and isinstance(self.eval_dataset, dict):  # a key of it
            dataset = self.eval_dataset.get(dataset)
        elif dataset is None:
            dataset = self.eval_dataset
        self._expect_eval_shapes(dataset)
        if self.monitor is None:
            return call(*args, **kwargs)
        outer = self._call_monitor
        with contextlib.ExitStack() as stack:
            if not self.monitor.running:  # outside train(): the trainer's monitor records it too
                stack.enter_context(self.monitor)
            self._call_monitor = self.eval_monitor = stack.enter_context(CompileMonitor())
            try:
                result = call(*args, **kwargs)
            finally:
                self._call_monitor = outer
        if hasattr(result, "metrics") and isinstance(result.metrics, dict):  # predict()
            self._add_figures(result.metrics, self.eval_monitor)
        return result

    def _regional(self) -> bool:
        plan = get_regional_plan(self.model) if self.model is not None else None
        return plan is not None and any(group.compiled for group in plan.groups)

    def _expect_eval_shapes(self, dataset: Any) -> None:
        """Tell the plan the evaluation batches' shapes: the loader keeps the dataset's order, so
        they follow from the samples' lengths and the collator's buckets."""
        if not self._regional() or not isinstance(self.data_collator, PadToBucketCollator):
            return
        datasets = dataset.values() if isinstance(dataset, dict) else [dataset]
        for one in datasets:
            if one is None or not hasattr(one, "__len__") or not hasattr(one, "__getitem__"):
                continue  # an iterable dataset: its shapes are not known before it runs
            try:
                shapes = self.data_collator.batch_shapes(
                    one, self.args.eval_batch_size, drop_last=self.args.dataloader_drop_last
                )
            except (AttributeError, TypeError, ValueError) as err:  # rows that are not mappings
                logger.info(
                    "CompileTrainer: the evaluation shapes are not known before it runs "
                    "(%s); the plan assumes the training ones",
                    err,
                )
                continue
            expect_shapes(self.model, shapes, mode="eval")

    def log(self, logs: dict[str, float], *args: Any, **kwargs: Any) -> None:
        """Add the compile figures to ``logs``, then log as Trainer does (every consumer sees them):
        inside ``evaluate``/``predict`` that call's own, else those of :attr:`monitor`.

        Args:
            logs: the values to log.
            *args: passed on (``start_time``).
            **kwargs: passed on.
        """
        self._add_figures(logs, self._call_monitor or self.monitor)
        super().log(logs, *args, **kwargs)

    @staticmethod
    def _add_figures(logs: dict[str, Any], monitor: CompileMonitor | None) -> None:
        if monitor is not None:
            for key, value in monitor.snapshot().items():
                if isinstance(value, (int, float)):
                    logs[_LOG_PREFIX + key] = value


def _refuse_whole_model_compile(args: Any, model: Any) -> None:
    if not getattr(args, "torch_compile", False) or model is None:
        return
    if get_regional_plan(model) is not None or _dynamo.compiled_module_names(model):
        raise ValueError(
            "TrainingArguments(torch_compile=True) on a regionally compiled "
            f"{type(model).__name__}: accelerate would torch.compile the whole model "
            "and the blocks' own graphs would never run (more graphs, graph breaks, "
            "slower). Pass TrainingArguments(torch_compile=False) and keep "
            "compile_regional(model, ...) (put torch_compile_backend/mode into "
            "compile_regional's keyword arguments)."
        )


def __getattr__(name: str) -> Any:
    # CompileTrainer subclasses transformers.Trainer: built on first use, so importing this
    # module does not import transformers.
    if name == "CompileTrainer":
        from transformers import Trainer

        cls = type(
            "CompileTrainer",
            (CompileTrainerMixin, Trainer),
            {
                "__doc__": "``transformers.Trainer`` with :class:`CompileTrainerMixin`.",
                "__module__": __name__,
            },
        )
        globals()[name] = cls
        return cls
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
