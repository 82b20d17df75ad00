"""Data loading: one global sample order on any number of processes (:class:`GlobalOrderSampler`), a loader whose
position is saved and restored mid-epoch (torchdata's StatefulDataLoader), and exact validation batches.
"""

from __future__ import annotations

import math
import random
import warnings
from collections.abc import Iterator, Mapping
from dataclasses import dataclass

import numpy as np
import torch
from torch.utils.data import BatchSampler, DataLoader, Dataset, DistributedSampler, Sampler
from torchdata.stateful_dataloader import StatefulDataLoader

from mgpucli.cpus import available_cores
from mgpucli.distributed.runtime import Runtime
from mgpucli.errors import UsageError

# torchdata 0.11 calls a deprecated torch API on every loader; the warning is torchdata's, not the user's.
warnings.filterwarnings("ignore", message=".*set_vital.*is deprecated", category=UserWarning)


def resolve_num_workers(setting: int | str, runtime: Runtime) -> int:
    """``auto``: none on CPU (in-process data beats workers that compete with compute threads), else a few
    per GPU process, leaving one core for the main process."""
    if setting != "auto":
        return int(setting)
    if runtime.device.type == "cpu":
        return 0
    per_process = available_cores() // max(1, runtime.env.local_world_size)
    return max(0, min(4, per_process - 1))


def seed_worker(worker_id: int) -> None:
    """Seed numpy and random in a loader worker from torch's per-worker seed (which differs per rank)."""
    seed = torch.initial_seed() % 2**32
    np.random.seed(seed)
    random.seed(seed)


class FixedBatches(Sampler[list[int]]):
    """Validation batches that don't depend on the process count.

    Batch ``i`` is always samples ``[i*B, (i+1)*B)``; rank ``r`` gets batches ``r, r+W, r+2W...``. Every sample is
    counted exactly once (no padding), and every process count runs the same forward passes on the same
    batches, so per-batch sums combined in batch order are bitwise identical on 1 and N processes.
    """

    def __init__(self, num_samples: int, batch_size: int, rank: int, world_size: int):
        self.num_samples, self.batch_size = num_samples, batch_size
        self.num_batches = (num_samples + batch_size - 1) // batch_size
        self.batch_ids = list(range(rank, self.num_batches, world_size))

    def __iter__(self) -> Iterator[list[int]]:
        for i in self.batch_ids:
            yield list(range(i * self.batch_size, min((i + 1) * self.batch_size, self.num_samples)))

    def __len__(self) -> int:
        return len(self.batch_ids)


class GlobalOrderSampler(DistributedSampler):
    """DistributedSampler's order, which can start part-way into an epoch on any number of processes.

    An epoch's order is a permutation of the whole train set by (seed, epoch), whatever the process count; padded
    with its first samples to a multiple of the process count W, rank ``r`` takes positions ``r, r+W, r+2W...``.
    Taken in batches of B, batch ``k`` of every rank together is positions ``[k*B*W, (k+1)*B*W)``: each optimizer
    step consumes the next ``global batch`` samples of the one order, so a count of samples consumed says where an
    epoch stands on any process count. :meth:`resume_at` starts an epoch after that many samples: the rest of the
    order, padded (with the epoch's first samples) to a multiple of this run's process count, split the same way.
    Starting at 0 is exactly ``DistributedSampler(drop_last=False)``.
    """

    def __init__(self, dataset: Dataset, num_replicas: int, rank: int, shuffle: bool, seed: int):
        super().__init__(dataset, num_replicas=num_replicas, rank=rank, shuffle=shuffle, seed=seed, drop_last=False)
        self._resume: tuple[int, int] | None = None  # (epoch, samples of it already consumed)

    def resume_at(self, epoch: int, consumed: int) -> None:
        """Epoch ``epoch`` (when set) starts after its first ``consumed`` samples; other epochs start at 0."""
        self._resume = (epoch, consumed)

    @property
    def skipped(self) -> int:
        """Samples of the current epoch's order before the first one this sampler yields."""
        return self._resume[1] if self._resume is not None and self._resume[0] == self.epoch else 0

    def __iter__(self) -> Iterator[int]:
        size = len(self.dataset)
        if self.shuffle:
            generator = torch.Generator()
            generator.manual_seed(self.seed + self.epoch)
            order = torch.randperm(size, generator=generator).tolist()
        else:
            order = list(range(size))
        rest = order[self.skipped:]
        padding = len(self) * self.num_replicas - len(rest)
        if padding:
            rest += (order * math.ceil(padding / size))[:padding]
        return iter(rest[self.rank::self.num_replicas])

    def __len__(self) -> int:
        return math.ceil(max(0, len(self.dataset) - self.skipped) / self.num_replicas)


def samples_consumed(sampler: GlobalOrderSampler, batches: int, batch_size: int) -> int:
    """How many samples of the epoch's order every rank together has taken after ``batches`` batches each (the
    padding at the epoch's end is not counted: at most the train set's size)."""
    return min(len(sampler.dataset), sampler.skipped + batches * batch_size * sampler.num_replicas)


def collate_fn_of(dataset: Dataset):
    """The dataset's own ``collate_fn`` (how its samples become a batch: mgpu's text datasets pad each batch with
    their tokenizer), else None: torch's default collation."""
    collate = getattr(dataset, "collate_fn", None)
    return collate if callable(collate) else None


@dataclass
class Loaders:
    train: StatefulDataLoader
    sampler: GlobalOrderSampler
    val: DataLoader | None
    val_batches: FixedBatches | None
    num_workers: int


def train_set_too_small(n_train: int, batch: int, world_size: int) -> UsageError | None:
    """The error for a train set too small for one batch on every process (each would get an empty epoch)."""
    if n_train >= batch * world_size:
        return None
    return UsageError(f"data.train has {n_train} samples: too few for one batch of {batch} on each of {world_size} "
                      f"process(es) (needs {batch * world_size}).",
                      "Use a larger dataset, a smaller data.batch_size, or fewer processes.")


def build_loaders(train_set: Dataset, val_set: Dataset | None, data_cfg, seed: int, runtime: Runtime) -> Loaders:
    """Build the train loader (sharded by DistributedSampler) and the exact validation loader."""
    batch = int(data_cfg.batch_size)
    too_small = train_set_too_small(len(train_set), batch, runtime.world_size)
    if too_small is not None:
        raise too_small
    workers = resolve_num_workers(data_cfg.num_workers, runtime)
    pin = runtime.device.type == "cuda" if data_cfg.pin_memory == "auto" else bool(data_cfg.pin_memory)
    common = {"num_workers": workers, "pin_memory": pin, "worker_init_fn": seed_worker if workers else None,
              "persistent_workers": workers > 0}
    sampler = GlobalOrderSampler(train_set, num_replicas=runtime.world_size, rank=runtime.rank,
                                 shuffle=bool(data_cfg.shuffle), seed=seed)
    # torch's BatchSampler, not torchdata's default, which builds each batch index by index in Python. Without a
    # stateful batch sampler, StatefulDataLoader saves how many batches it yielded and resumes by skipping as many
    # from the same (seeded, set_epoch'd) sampler, which also reads the state torchdata's batch sampler saved
    # (tests/unit/test_loader_state.py).
    batches = BatchSampler(sampler, batch, drop_last=bool(data_cfg.drop_last))
    train = StatefulDataLoader(train_set, batch_sampler=batches, collate_fn=collate_fn_of(train_set), **common)
    val = val_batches = None
    if val_set is not None:
        if len(val_set) == 0:
            raise UsageError("data.val is empty.", "Point data.val at a dataset with samples, or set data.val=null.")
        val_batch = int(data_cfg.val_batch_size or batch)
        val_batches = FixedBatches(len(val_set), val_batch, runtime.rank, runtime.world_size)
        val = DataLoader(val_set, batch_sampler=val_batches, collate_fn=collate_fn_of(val_set), **common)
    return Loaders(train=train, sampler=sampler, val=val, val_batches=val_batches, num_workers=workers)


def to_device(batch, device: torch.device, non_blocking: bool):
    """Move a (possibly nested) batch to ``device``; a mapping (a dict, Transformers' ``BatchEncoding``) becomes a
    dict."""
    if isinstance(batch, torch.Tensor):
        return batch.to(device, non_blocking=non_blocking)
    if isinstance(batch, (list, tuple)):  # tensors inline: this runs every step
        return type(batch)([b.to(device, non_blocking=non_blocking) if isinstance(b, torch.Tensor)
                            else to_device(b, device, non_blocking) for b in batch])
    if isinstance(batch, Mapping):
        return {k: to_device(v, device, non_blocking) for k, v in batch.items()}
    return batch


def channels_last(batch):
    """``trainer.channels_last``: the batch's image tensors (4-D: the inputs of an ``(inputs, targets)`` batch, or
    any 4-D floating value of a dict batch) in channels-last memory format."""
    if isinstance(batch, Mapping):
        return {k: v.contiguous(memory_format=torch.channels_last)
                if isinstance(v, torch.Tensor) and v.dim() == 4 and v.is_floating_point() else v
                for k, v in batch.items()}
    inputs, *rest = batch
    if inputs.dim() == 4:
        return (inputs.contiguous(memory_format=torch.channels_last), *rest)
    return batch
