"""``TrainerMixin``: Hugging Face's Trainer on the PyTorch face, resumed from its checkpoints."""
from __future__ import annotations

import contextlib
import functools
import inspect
import json
import os
import warnings

import torch

from .loader import DataLoader

__all__ = ["TrainerMixin"]

#: The file a checkpoint keeps the training loader's position in (one a process
#: when there are several, as Trainer names its ``rng_state_{process_index}.pth``).
TRAINER_STATE_FILE = "netcl_loader_state.json"


def _state_file(checkpoint, args):
    if args.world_size <= 1:
        return os.path.join(checkpoint, TRAINER_STATE_FILE)
    stem, ext = os.path.splitext(TRAINER_STATE_FILE)
    return os.path.join(checkpoint, f"{stem}_{args.process_index}{ext}")


@contextlib.contextmanager
def _own_skip(trainer_type, loader):
    """While it runs, Trainer's ``skip_first_batches`` hands ``loader`` back as it is.

    ``Trainer._run_epoch`` (transformers 5.x) calls accelerate's
    ``skip_first_batches(train_dataloader, steps_trained_in_current_epoch)`` in the
    resumed epoch, by the name its module imported.  For a loader that is not
    Accelerate's, that function rebuilds it as torch's own ``DataLoader`` around a
    ``SkipBatchSampler`` (accelerate's ``data_loader.py``): the engine would not
    run.  Trainer's step counting of the resumed epoch (``step``,
    ``num_update_steps_trained``, the accumulation boundaries) must stay as it is,
    so the skip is not turned off (``ignore_data_skip`` would restart the count);
    the loader, already at the saved position by its ``load_state_dict``, is
    what the skip gives.  Every ``_run_epoch`` in the Trainer's class hierarchy
    looks the name up in its own module, so each such module's name is replaced
    for the call and restored after it.
    """
    modules = []
    for cls in trainer_type.__mro__:
        run_epoch = vars(cls).get("_run_epoch")
        namespace = getattr(run_epoch, "__globals__", None)
        if namespace is not None and "skip_first_batches" in namespace:
            if all(ns is not namespace for ns, _ in modules):
                modules.append((namespace, namespace["skip_first_batches"]))

    def keep(original):
        @functools.wraps(original)
        def skip_first_batches(dataloader, num_batches=0):
            if dataloader is loader:
                return loader  # resumed by its own state
            return original(dataloader, num_batches)
        return skip_first_batches

    for namespace, original in modules:
        namespace["skip_first_batches"] = keep(original)
    try:
        yield
    finally:
        for namespace, original in modules:
            namespace["skip_first_batches"] = original


class TrainerMixin:
    """Make a Hugging Face ``transformers.Trainer`` train and evaluate on this engine.

    Put it first among the bases of a Trainer class (``Trainer`` or any subclass
    of it, such as TRL's trainers)::

        class MyTrainer(netcl_loader.torch.TrainerMixin, transformers.Trainer):
            pass

    The train, eval and test loaders are :class:`netcl_loader.torch.DataLoader`
    built from the Trainer's own arguments as its ``_get_dataloader`` builds
    PyTorch's: the datasets (a ``datasets.Dataset`` without the columns the
    model's ``forward`` does not take, else the collator removing them, by
    Trainer's own helpers), ``data_collator``, the batch sizes
    (``_train_batch_size``, ``eval_batch_size``), ``dataloader_num_workers``,
    ``dataloader_drop_last``, ``dataloader_persistent_workers``,
    ``dataloader_prefetch_factor``, ``dataloader_pin_memory``,
    ``dataloader_multiprocessing_context``, ``dataloader_in_order``, Trainer's
    worker seeding for training, and ``data_seed`` (else ``seed``) as the seed
    of the shuffled order.  In a run of several processes the training loader
    is sharded with ``rank=args.process_index``, ``world_size=args.world_size``:
    each rank sees its own share of every epoch.  They are not passed to
    Accelerate's ``prepare()``, which would rebuild them as PyTorch's loader.

    Every checkpoint holds the training loader's ``state_dict()``
    (``netcl_loader_state.json``, one a process when there are several), and
    ``train(resume_from_checkpoint=...)`` loads it: the resumed run yields
    exactly the batches the interrupted one would have yielded from the saved
    step on, made by the engine, in the resumed epoch and every later one, and
    Trainer's own skip of the first batches does not rebuild the loader.
    ``ignore_data_skip=True`` keeps Trainer's meaning: the resumed epoch
    starts from its beginning.

    ``train_sampling_strategy`` may be ``"random"`` (the default: shuffled) or
    ``"sequential"``; the others (``"group_by_length"``, ``"batch_rebalance"``)
    are Trainer's samplers, which this engine does not reproduce: ValueError.
    In a run of several processes evaluation and prediction keep Trainer's own
    loaders (their results are gathered across processes in the order and with
    the padding of Accelerate's sharding).
    """

    # -- loaders -------------------------------------------------------------------
    def get_train_dataloader(self):
        """The training loader (see the class): a ``netcl_loader.torch.DataLoader``."""
        if self.train_dataset is None:
            raise ValueError("Trainer: training requires a train_dataset.")
        strategy = getattr(self.args, "train_sampling_strategy", "random")
        if strategy not in ("random", "sequential"):
            raise ValueError(
                f"TrainerMixin: train_sampling_strategy={strategy!r} is one of Trainer's own "
                f"samplers, which netcl_loader does not reproduce; use 'random' (shuffled, "
                f"the default) or 'sequential', or drop TrainerMixin to keep Trainer's loader")
        old = self.__dict__.get("_netcl_train_loader")
        if old is not None:
            old.close()  # the previous train() call's (its persistent workers end)
        loader = self._netcl_dataloader(self.train_dataset, "Training", self._train_batch_size,
                                        training=True, shuffle=strategy == "random")
        self._netcl_train_loader = loader
        return loader

    def get_eval_dataloader(self, eval_dataset=None):
        """The evaluation loader: a ``netcl_loader.torch.DataLoader`` in one process
        (Trainer's own in a run of several)."""
        if self.args.world_size > 1:
            return super().get_eval_dataloader(eval_dataset)
        if eval_dataset is None and self.eval_dataset is None:
            raise ValueError("Trainer: evaluation requires an eval_dataset.")
        # As Trainer.get_eval_dataloader: a named eval set is self.eval_dataset[name],
        # and with persistent workers one loader a set serves every evaluation.
        key = eval_dataset if isinstance(eval_dataset, str) else "eval"
        cache = self.__dict__.setdefault("_netcl_eval_loaders", {})
        if self.args.dataloader_persistent_workers and key in cache:
            return cache[key]
        if isinstance(eval_dataset, str):
            dataset = self.eval_dataset[eval_dataset]
        else:
            dataset = eval_dataset if eval_dataset is not None else self.eval_dataset
        loader = self._netcl_dataloader(dataset, "Evaluation", self.args.eval_batch_size)
        if self.args.dataloader_persistent_workers:
            cache[key] = loader
        return loader

    def get_test_dataloader(self, test_dataset):
        """The prediction loader: a ``netcl_loader.torch.DataLoader`` in one process
        (Trainer's own in a run of several)."""
        if self.args.world_size > 1:
            return super().get_test_dataloader(test_dataset)
        return self._netcl_dataloader(test_dataset, "test", self.args.eval_batch_size)

    def _netcl_dataloader(self, dataset, description, batch_size, training=False, shuffle=False):
        """A loader over ``dataset`` from the Trainer's arguments, as
        ``Trainer._get_dataloader`` makes PyTorch's (without ``accelerator.prepare``)."""
        from transformers.trainer_utils import seed_worker
        from transformers.utils import is_datasets_available

        args = self.args
        collate_fn = self.data_collator
        if is_datasets_available():
            import datasets
            hf_dataset = isinstance(dataset, datasets.Dataset)
        else:
            hf_dataset = False
        if hf_dataset:
            dataset = self._remove_unused_columns(dataset, description=description)
        else:
            collate_fn = self._get_collator_with_removed_columns(collate_fn,
                                                                 description=description)
        # Trainer's test for a dataset without a sampler (transformers' _get_dataloader).
        iterable = isinstance(dataset, torch.utils.data.IterableDataset)
        kw = dict(batch_size=batch_size, collate_fn=collate_fn,
                  num_workers=args.dataloader_num_workers,
                  pin_memory=args.dataloader_pin_memory,
                  persistent_workers=args.dataloader_persistent_workers,
                  multiprocessing_context=args.dataloader_multiprocessing_context,
                  prefetch_factor=args.dataloader_prefetch_factor,
                  in_order=args.dataloader_in_order,
                  seed=args.data_seed if args.data_seed is not None else args.seed)
        if not iterable:
            kw["drop_last"] = args.dataloader_drop_last
            kw["shuffle"] = shuffle
            if training:
                # Trainer's own worker seeding: each rank's workers seed apart.
                kw["worker_init_fn"] = functools.partial(
                    seed_worker, num_workers=args.dataloader_num_workers,
                    rank=args.process_index)
        if training and args.world_size > 1:
            if iterable:
                raise ValueError(
                    f"TrainerMixin: the train_dataset {type(dataset).__name__} is iterable-style "
                    f"and this run has {args.world_size} processes: netcl_loader shards only "
                    f"a map-style dataset's order (one with __getitem__ and __len__); drop "
                    f"TrainerMixin to keep Trainer's loader, which dispatches batches")
            kw.update(rank=args.process_index, world_size=args.world_size)
        return DataLoader(dataset, **kw)

    # -- checkpoints -------------------------------------------------------------------
    def _save_rng_state(self, output_dir):
        # Trainer._save_checkpoint saves each process's RNG state here, for an exact
        # resume, in every checkpoint that can be resumed (not with save_only_model):
        # the training loader's position goes beside it.
        super()._save_rng_state(output_dir)
        loader = self.__dict__.get("_netcl_train_loader")
        if loader is None:
            return
        os.makedirs(output_dir, exist_ok=True)
        path = _state_file(output_dir, self.args)
        with open(path + ".tmp", "w") as f:
            json.dump(loader.state_dict(), f)
        os.replace(path + ".tmp", path)

    def _run_epoch(self, *args, **kwargs):
        # Trainer._inner_training_loop calls _run_epoch once an epoch with the
        # loader from get_train_dataloader; in the resumed epoch (epoch ==
        # epochs_trained, with steps_trained_in_current_epoch batches of it done,
        # 0 with ignore_data_skip) it skips those batches.  Here the loader loads
        # its saved position instead, and the skip gives it back as it is.
        # Trainer then calls set_epoch(epoch) on it, the loaded state's epoch,
        # which keeps the resume.
        run_epoch = super()._run_epoch
        call = inspect.signature(run_epoch).bind(*args, **kwargs).arguments
        loader = call.get("train_dataloader")
        checkpoint = call.get("resume_from_checkpoint")
        done = call.get("steps_trained_in_current_epoch") or 0
        if (checkpoint is None or not done or call.get("epoch") != call.get("epochs_trained")
                or loader is None or loader is not self.__dict__.get("_netcl_train_loader")):
            return run_epoch(*args, **kwargs)
        path = _state_file(checkpoint, self.args)
        if not os.path.isfile(path):
            warnings.warn(
                f"TrainerMixin: the checkpoint {checkpoint} holds no netcl_loader state "
                f"({os.path.basename(path)}; it was saved without TrainerMixin): Trainer's "
                f"skip_first_batches serves the rest of the resumed epoch with PyTorch's "
                f"loader (in this loader's order), and the engine takes over from the next "
                f"epoch", UserWarning, stacklevel=2)
            return run_epoch(*args, **kwargs)
        with open(path) as f:
            state = json.load(f)
        position = int(state["batches_done"]) + len(state["extra_done"])
        if int(state["epoch"]) != call["epoch"] or position != done:
            raise ValueError(
                f"TrainerMixin: the loader state in {path} is at epoch {state['epoch']} after "
                f"{position} batches, but Trainer resumes epoch {call['epoch']} after {done} "
                f"batches: the checkpoint's files disagree")
        loader.load_state_dict(state)
        with _own_skip(type(self), loader):
            return run_epoch(*args, **kwargs)
