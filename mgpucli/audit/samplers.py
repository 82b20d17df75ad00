"""``DistributedSampler``: ``set_epoch`` never called (the same shuffle every epoch), and padded evaluation.

``DistributedSampler.__init__`` records where each sampler was created, ``set_epoch`` that it was called; its
``__iter__`` (when a loader starts going through it) looks at its padding, and hands out its indices through a watch
that sees the pass end. An epoch is a full pass: when one ends, the epoch it was shuffled for is compared with the
last full pass's. A partial pass is no epoch: the tutorial's peek at the first batch
(``len(next(iter(loader))[0])``, before ``set_epoch``) shuffles for the previous epoch and is never judged. (With
loader worker processes, the indices are drawn a few batches ahead of the batches used: a peek at a loader whose
whole epoch fits in that prefetch counts as a full pass.) Without ``drop_last`` a dataset whose length is not a
multiple of the world size is padded with repeated samples, which is harmless in training and skews a metric in
evaluation.
Evaluation means ``shuffle=False``, or iteration under ``torch.no_grad()``/``inference_mode``. Local checks: no store,
nothing sent.
"""

from __future__ import annotations

import functools
import weakref
from collections.abc import Iterator
from dataclasses import dataclass

import torch
from torch.utils.data import DistributedSampler

from mgpucli.audit import libraries
from mgpucli.audit.session import Session
from mgpucli.torch_parts import replace


@dataclass
class _State:
    call: libraries.Call  # where it was created: the user's line, and the library that made it for the script
    iterations: int = 0  # passes begun, partial ones included
    full_passes: int = 0  # passes that went through every index: the epochs
    last_epoch: int | None = None  # the epoch the last full pass was shuffled for
    set_epoch_calls: int = 0


def padding(sampler: DistributedSampler) -> int:
    """How many samples the sampler repeats to give every rank as many (0 with ``drop_last``)."""
    if sampler.drop_last:
        return 0
    return max(0, sampler.total_size - len(sampler.dataset))  # type: ignore[arg-type]


def orders_itself(sampler: DistributedSampler) -> bool:
    """A subclass whose own ``__iter__`` picks the order (Lightning's ``DistributedSamplerWrapper`` shards the draws
    of the sampler it wraps, a ``WeightedRandomSampler`` in training): its ``shuffle=False`` says nothing of
    evaluation."""
    return type(sampler).__iter__ is not DistributedSampler.__iter__


def evaluating(sampler: DistributedSampler) -> bool:
    """Iterated for evaluation: under ``torch.no_grad()``/``inference_mode``, or in torch's own order without
    shuffling."""
    return not torch.is_grad_enabled() or (not sampler.shuffle and not orders_itself(sampler))


def same_shuffle(sampler: DistributedSampler, state: _State, epoch: int) -> bool:
    """A full pass shuffled for ``epoch`` went exactly as the previous full pass did: ``set_epoch`` not called, or
    called with the same value (a sampler without shuffle has the same order on purpose)."""
    return bool(sampler.shuffle) and state.full_passes > 0 and state.last_epoch == epoch


class Samplers:
    def __init__(self, session: Session):
        self.s = session
        self._states: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()

    def install(self) -> None:
        states = self._states
        checks = self

        def made(original):
            @functools.wraps(original)
            def __init__(sampler, *args, **kwargs):
                original(sampler, *args, **kwargs)
                states[sampler] = _State(libraries.here())

            return __init__

        def iterated(original):
            @functools.wraps(original)
            def __iter__(sampler):
                checks.iterating(sampler)
                return checks.passing(sampler, original(sampler))

            return __iter__

        def epoch_set(original):
            @functools.wraps(original)
            def set_epoch(sampler, epoch):
                original(sampler, epoch)
                state = states.get(sampler)
                if state is not None:
                    state.set_epoch_calls += 1

            return set_epoch

        for name, wrap in (("__init__", made), ("__iter__", iterated), ("set_epoch", epoch_set)):
            replace(f"torch.utils.data.distributed.DistributedSampler.{name}", wrap)

    def _state(self, sampler: DistributedSampler) -> _State:
        state = self._states.get(sampler)
        if state is None:  # built where its __init__ was not watched: named where it is used
            state = self._states[sampler] = _State(libraries.here())
        return state

    def iterating(self, sampler: DistributedSampler) -> None:
        state = self._state(sampler)
        try:
            if state.iterations == 0:
                self.s.count("distributed samplers")
            extra = padding(sampler)
            if extra and evaluating(sampler):
                self._report_padding(sampler, state, extra)
        finally:
            state.iterations += 1

    def passing(self, sampler: DistributedSampler, indices: Iterator[int]) -> Iterator[int]:
        """``indices`` (one pass of ``sampler``, shuffled for its epoch now), handed out as they are; when the pass
        ends, :meth:`completed` judges it. A pass left early (a peek, a ``break``) is never judged."""
        epoch = sampler.epoch

        def watched() -> Iterator[int]:
            yield from indices
            try:
                self.completed(sampler, epoch)
            except Exception as err:  # noqa: BLE001 - the audit never breaks the script's loop
                self.s.note(f"a sampler's pass could not be checked ({type(err).__name__}: {err})")

        return watched()

    def completed(self, sampler: DistributedSampler, epoch: int) -> None:
        """A full pass of ``sampler`` shuffled for ``epoch`` ended: an epoch."""
        state = self._state(sampler)
        try:
            if same_shuffle(sampler, state, epoch):
                self._report_epoch(state, epoch)
        finally:
            state.full_passes += 1
            state.last_epoch = epoch

    def _report_epoch(self, state: _State, epoch: int) -> None:
        how = "never called" if not state.set_epoch_calls else f"called with the same value ({epoch})"
        self.s.report(
            "set_epoch_missing",
            f"DistributedSampler.set_epoch {how}: epoch {state.full_passes + 1} is shuffled exactly like epoch "
            f"{state.full_passes}",
            "The sampler's shuffle is seeded by seed + epoch: without set_epoch every epoch visits the samples in the "
            "same order, and each rank sees the same part of the dataset every epoch.",
            "for epoch in range(epochs):\n"
            "    sampler.set_epoch(epoch)  # before iterating the loader, every epoch\n"
            "    for batch in loader:\n"
            "        ...",
            state.call.where, {"epoch": epoch, "full_passes": state.full_passes + 1})

    def _report_padding(self, sampler: DistributedSampler, state: _State, extra: int) -> None:
        n = len(sampler.dataset)  # type: ignore[arg-type]
        ordered = not sampler.shuffle and not orders_itself(sampler)
        why = "shuffle=False" if ordered else "iterated under torch.no_grad()"
        fix, cost = libraries.in_terms(
            "padded_evaluation",
            "# every sample exactly once: a strided slice per rank, no padding\n"
            "from torch.utils.data import Subset\n"
            "part = Subset(val_set, range(rank, len(val_set), world_size))\n"
            "val_loader = DataLoader(part, batch_size=batch_size)\n"
            "# add up the metric's sums and counts per rank, then dist.all_reduce both and divide;\n"
            "# or evaluate on rank 0 alone with a plain DataLoader(val_set)",
            f"Without drop_last, DistributedSampler pads the dataset to a multiple of the world size with repeated "
            f"samples: a metric averaged over the ranks counts {extra} of them twice, so it is computed over "
            f"{sampler.total_size} samples instead of {n} and differs from one process's. (drop_last=True would "
            f"leave {n % sampler.num_replicas} out instead.)",
            state.call.library, self.s.library)
        self.s.report(
            "padded_evaluation",
            f"padded evaluation: DistributedSampler over {n} samples on {sampler.num_replicas} ranks ({why}) repeats "
            f"{extra} sample{'s' if extra > 1 else ''} to make {sampler.total_size}: {extra} counted twice",
            cost, fix, state.call.where, {"samples": n, "world_size": sampler.num_replicas, "padded": extra,
                                          "total": sampler.total_size, "shuffle": bool(sampler.shuffle)})
