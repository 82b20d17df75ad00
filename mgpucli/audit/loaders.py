"""A DataLoader that hands every rank the same samples: no DistributedSampler in a multi-process job.

``DataLoader.__init__`` records where each loader was created; the first ``iter()`` of a loader (the first epoch)
describes what it will go through: a map-style dataset read through one of torch's own non-distributed samplers
(sequential, random, subset-random, weighted), its length, and for a ``Subset`` a sample of its indices. The ranks'
descriptions meet in the rendezvous store under the loader's place in the code; when every rank iterates a loader
from that place and they all describe the same samples, every rank goes through all of them. A loader only some ranks
iterate (validation on rank 0 alone) never completes the count, and is no finding; nor is a ``Subset`` per rank, a
custom sampler or an ``IterableDataset``, which shard in ways the audit cannot see, nor a loader a training library
iterates and shards its own way (:data:`mgpucli.audit.libraries.LIBRARIES`: Accelerate's dispatched batches, read on
rank 0 and split among the ranks). Accelerate's (and so the Trainer's) other prepared loaders have a batch sampler of
its own, which shards, in a job it joined; one it did not join (each rank alone) hands every rank all the samples,
and is found.
"""

from __future__ import annotations

import functools
import hashlib
import weakref
from typing import Any

from torch.utils.data import (
    BatchSampler,
    DataLoader,
    DistributedSampler,
    IterableDataset,
    RandomSampler,
    SequentialSampler,
    Subset,
    SubsetRandomSampler,
    WeightedRandomSampler,
)

from mgpucli.audit import libraries
from mgpucli.audit.session import Session
from mgpucli.audit.where import user_where
from mgpucli.torch_parts import replace

_PLAIN = (SequentialSampler, RandomSampler, SubsetRandomSampler, WeightedRandomSampler)


def index_sampler(loader: DataLoader) -> Any:
    """The sampler that picks the loader's indices (a custom batch sampler's own ``sampler``; None if unknown)."""
    batch = loader.batch_sampler
    if batch is not None and type(batch) is not BatchSampler:
        return getattr(batch, "sampler", None)
    return loader.sampler


def _indices_digest(indices: Any) -> str:
    n = len(indices)
    step = max(1, n // 256)
    picked = [int(indices[i]) for i in range(0, n, step)] + ([int(indices[n - 1])] if n else [])
    return hashlib.sha1(f"{n}:{picked}".encode()).hexdigest()[:16]


def _dataset_identity(dataset: Any, depth: int = 0) -> Any:
    """What identifies the dataset's samples across ranks without reading any: its type and length, and for a
    ``Subset`` (nested ones too) which indices it keeps."""
    try:
        size = len(dataset)
    except TypeError:
        size = None
    if isinstance(dataset, Subset) and depth < 8:
        return ["Subset", size, _indices_digest(dataset.indices), _dataset_identity(dataset.dataset, depth + 1)]
    return [type(dataset).__qualname__, size]


def describe(loader: DataLoader) -> dict[str, Any] | None:
    """What this loader goes through on this rank, when it is read through a non-distributed torch sampler (None:
    distributed, iterable, or a sampler the audit does not know)."""
    if isinstance(loader.dataset, IterableDataset):
        return None
    sampler = index_sampler(loader)
    if sampler is None or isinstance(sampler, DistributedSampler) or type(sampler) not in _PLAIN:
        return None  # a distributed one, or a custom one that may shard by rank: not the audit's to judge
    ident: dict[str, Any] = {"sampler": type(sampler).__name__, "dataset": _dataset_identity(loader.dataset)}
    try:
        ident["samples"] = len(sampler)
    except TypeError:
        ident["samples"] = None
    if isinstance(sampler, SubsetRandomSampler):
        ident["indices"] = _indices_digest(sampler.indices)
    return ident


class Loaders:
    def __init__(self, session: Session):
        self.s = session
        self._sites: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
        self._seen: weakref.WeakSet = weakref.WeakSet()
        self._per_site: dict[str, int] = {}

    def install(self) -> None:
        if not self.s.distributed:
            return
        checks = self

        def made(original):
            @functools.wraps(original)
            def __init__(loader, *args, **kwargs):
                original(loader, *args, **kwargs)
                checks.created(loader)

            return __init__

        def iterated(original):
            @functools.wraps(original)
            def __iter__(loader):
                if loader not in checks._seen:
                    checks.first_iter(loader)
                return original(loader)

            return __iter__

        replace("torch.utils.data.DataLoader.__init__", made)
        replace("torch.utils.data.DataLoader.__iter__", iterated)

    def created(self, loader: DataLoader) -> None:
        where = user_where()
        place = f"{where.file}:{where.line}" if where else "?"
        number = self._per_site.get(place, 0)
        self._per_site[place] = number + 1
        self._sites[loader] = (where, f"{place}#{number}")

    def first_iter(self, loader: DataLoader) -> None:
        self._seen.add(loader)
        self.s.count("data loaders")
        call = libraries.here(setting=True, sharding=True)
        if call.sharded:
            return  # iterated by a library that shards it its own way (Accelerate's dispatched batches)
        try:
            ident = describe(loader)
        except Exception as err:  # noqa: BLE001 - a dataset without a length, or odd indices: no judgement
            self.s.note(f"a DataLoader could not be described ({type(err).__name__}: {err})")
            return
        if ident is None:
            return
        if loader not in self._sites:  # built where its __init__ was not watched: named where it is first iterated
            self.created(loader)
        where, key = self._sites[loader]
        self.s.later(self._meet, key, ident, call.place("loader_not_distributed", where), call.library)

    def _meet(self, key: str, ident: dict[str, Any], where, library: libraries.Library | None = None) -> None:
        got = self.s.meet(f"loader/{key}", ident)
        if got is None or any(other != ident for other in got):
            return
        n = ident.get("samples")
        world = self.s.world_size
        many = f"all {n}" if n is not None else "all the"
        fix, cost = libraries.in_terms(
            "loader_not_distributed",
            "from torch.utils.data import DistributedSampler\n"
            "sampler = DistributedSampler(dataset)  # shuffles; drop shuffle=True from the DataLoader\n"
            "loader = DataLoader(dataset, batch_size=batch_size, sampler=sampler)\n"
            "for epoch in range(epochs):\n"
            "    sampler.set_epoch(epoch)",
            f"Each epoch is {world} times the work for the same samples: every rank reads, augments and computes the "
            f"whole dataset, so an epoch is {world} epochs' worth of updates on one copy of the data, not one epoch "
            "split across the ranks.",
            library, self.s.library)
        self.s.report(
            "loader_not_distributed",
            f"DataLoader without a DistributedSampler: every rank iterates {many} samples (the same ones on all "
            f"{world} ranks)",
            cost, fix, where, {"samples": n, "world_size": world, "sampler": ident.get("sampler")})
