"""A rank every other rank waits for, in a script: the step anatomy from public hooks, the straggler named.

Host clocks at three public points, no host sync, nothing changed in what the script computes:

- ``DataLoader.__iter__`` hands out the loader's iterator behind a thin proxy whose ``__next__`` is timed: the wait
  for the next batch (``data``);
- each parameter's post-accumulate-grad hook (registered on the parameters an optimizer steps, at its first step)
  notes when the last gradient of a backward was computed; the time from there to the next optimizer step is the
  wait for the gradient all-reduce beyond what overlapped with backward (``comm``: DDP's backward returns once every
  bucket is reduced; the script's own code between backward and ``step()`` is counted here too);
- the global optimizer step pre- and post-hooks time the optimizer (``optimizer``) and mark the steps; the rest of a
  step is ``compute`` (forward, backward, and the script's own work).

Every :data:`INTERVAL_STEPS` optimizer steps each rank publishes its figures in the rendezvous store
(:meth:`Session.meet`, on the audit's thread): the last rank to arrive keeps the interval with the latest ones and,
when one rank is persistently the one the others wait for (:func:`mgpucli.run_records.step_anatomy.find_straggler`,
the rule recipes use), reports it once for the job. One optimizer per step is assumed (a second one's steps count
as steps too).
"""

from __future__ import annotations

import functools
import json
import time
import weakref
from typing import Any

import torch
from torch.optim.optimizer import register_optimizer_step_post_hook, register_optimizer_step_pre_hook

from mgpucli.audit.session import Session
from mgpucli.run_records import step_anatomy
from mgpucli.torch_parts import replace

INTERVAL_STEPS = 10  # optimizer steps per published interval
KEEP = 20  # the latest intervals the straggler is judged on


class _TimedBatches:
    """A DataLoader's iterator, its ``next`` timed; everything else is the iterator's own."""

    def __init__(self, inner: Any, pace: Pace):
        self._inner, self._pace = inner, pace

    def __iter__(self):
        return self

    def __next__(self):
        started = time.perf_counter()
        try:
            return next(self._inner)
        finally:
            self._pace.seconds[0] += time.perf_counter() - started

    def __len__(self):
        return len(self._inner)

    def __getattr__(self, name: str):
        return getattr(self._inner, name)


class Pace:
    def __init__(self, session: Session):
        self.s = session
        self.seconds = [0.0, 0.0, 0.0, 0.0]  # data, compute (filled at the interval's end), comm, optimizer
        self.started: float | None = None  # the interval's start (the end of the first step: it is warm-up)
        self.steps = 0
        self.interval = 0
        self.last_grad = 0.0
        self.step_ended = 0.0
        self.step_began = 0.0
        self._hooked: weakref.WeakSet = weakref.WeakSet()

    def install(self) -> None:
        if not self.s.distributed:
            return
        pace = self

        def timed(original):
            @functools.wraps(original)
            def __iter__(loader):
                return _TimedBatches(original(loader), pace)

            return __iter__

        replace("torch.utils.data.DataLoader.__iter__", timed)
        register_optimizer_step_pre_hook(self._before_step)
        register_optimizer_step_post_hook(self._after_step)

    def _grad_ready(self, _param: torch.Tensor) -> None:
        self.last_grad = time.perf_counter()

    def _before_step(self, optimizer, _args, _kwargs) -> None:
        now = time.perf_counter()
        if optimizer not in self._hooked:
            self._hooked.add(optimizer)
            for group in optimizer.param_groups:
                for param in group["params"]:
                    if param.requires_grad:
                        param.register_post_accumulate_grad_hook(self._grad_ready)
        if self.started is not None and self.last_grad > self.step_ended:
            self.seconds[2] += now - self.last_grad
        self.step_began = now

    def _after_step(self, _optimizer, _args, _kwargs) -> None:
        now = time.perf_counter()
        self.step_ended = now
        if self.started is None:  # the first step: warm-up; the clock starts here
            self.started, self.seconds = now, [0.0, 0.0, 0.0, 0.0]
            return
        self.seconds[3] += now - self.step_began
        self.steps += 1
        if self.steps < INTERVAL_STEPS:
            return
        wall = now - self.started
        data, _, comm, opt = self.seconds
        figures = step_anatomy.figures([data, max(0.0, wall - data - comm - opt), comm, opt], wall, self.steps)
        self.s.later(self._meet, self.interval, figures)
        self.interval += 1
        self.started, self.steps, self.seconds = now, 0, [0.0, 0.0, 0.0, 0.0]

    def _meet(self, interval: int, figures: dict[str, float]) -> None:
        ranks = self.s.meet(f"pace/{interval}", figures)
        store = self.s.store()
        if ranks is None or store is None:
            return
        store.set(f"pace/all/{interval}", json.dumps(ranks))
        kept = [f"pace/all/{i}" for i in range(max(0, interval - KEEP + 1), interval + 1)]
        present = [key for key in kept if store.check([key])]
        records = [{"split": "train", step_anatomy.KEY: json.loads(v)} for v in store.multi_get(present)]
        if interval >= KEEP:
            store.delete_key(f"pace/all/{interval - KEEP}")
        found = step_anatomy.find_straggler(records)
        if found is None or store.add(f"pace/said/{found.rank}/{found.cause}", 1) != 1:
            return  # none, or said already (by whichever rank compared first)
        what, fix = step_anatomy.explain(found, script=True)
        self.s.report("straggler", what, "Every step runs at the slowest rank's pace: the others spend "
                      f"{found.others_comm:.0%} of their steps waiting for rank {found.rank} in all-reduce.", fix,
                      None, details=found.as_dict(), key=f"{found.rank}/{found.cause}")
