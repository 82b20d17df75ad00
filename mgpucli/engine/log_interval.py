"""Training metrics as sums on the device, reduced across ranks once per log interval.

The step path's rules live here: no host sync per step, one collective per log interval. Every micro-step adds
its task's sums (``Task.stats``, a float64 vector) to a device accumulator and keeps its detached loss; small
outputs of a task whose sums add up over batches (``Task.batched_stats``) wait for the interval's end instead, and
one ``stats`` call adds them all (each tensor op costs microseconds of dispatch however small its data: eight of
them per step were 3-4% of the quickstart's 2 ms step). At the
interval's last step the sums, the interval's loss total and this rank's stop request become one vector, whose
all-reduce starts asynchronously; the next step finishes it (its latency overlaps that step's work), writes the
record and reads two verdicts every rank reads alike, at the same step: a non-finite loss anywhere (the loss
total is NaN or inf on every rank then) and a stop requested anywhere. A save, the end of an epoch and a stop
reduce at once, so every step of a run ends up in exactly one record.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from mgpucli.distributed import collectives
from mgpucli.distributed.heartbeat import Heartbeat
from mgpucli.distributed.runtime import Runtime
from mgpucli.engine.anatomy import StepClock
from mgpucli.engine.tasks import Task
from mgpucli.errors import JobFailed
from mgpucli.run_records import step_anatomy

ANATOMY_SLOTS = 5  # per rank: seconds in data, compute, comm, optimizer, and the interval's wall time

NO_NONFINITE = 2**62  # "no non-finite step on this rank" in the MIN all-reduce that finds the first one
BATCHED_MAX_ELEMENTS = 1 << 14  # a step's outputs up to this many elements wait for the interval's stats call
PENDING_MAX_ELEMENTS = 1 << 20  # outputs kept waiting, at most (4 MiB of float32): more are added up at once


@dataclass
class InFlight:
    """An interval whose all-reduce has started: the reduced vector, and what its record and NaN check need."""

    reduced: torch.Tensor  # the task's sums, the loss total, the stop flag, the ranks' anatomy slots (float64)
    work: Any  # the collective's handle (None on one process)
    losses: list[torch.Tensor]  # this rank's detached losses, to name the first non-finite step if there is one
    loss_steps: list[int]
    step: int
    steps: int  # optimizer steps in the interval
    epoch: int  # the epoch the interval's steps belong to, numbered from 1
    elapsed: float
    lr: float
    time: float


class LogInterval:
    """The open interval's sums and losses, the interval in flight, and what the ranks agreed on so far.

    ``emit`` receives each interval's record (``split: train``) once its all-reduce is read. ``epoch_sums`` holds
    the reduced sums of the current epoch's intervals (host numbers: the epoch's means need no extra collective).
    """

    def __init__(self, task: Task, runtime: Runtime, heartbeat: Heartbeat, emit: Callable[[dict[str, Any]], None],
                 clock: StepClock | None = None):
        self.task, self.runtime, self.heartbeat, self.emit = task, runtime, heartbeat, emit
        self.clock = clock  # this rank's step anatomy (engine/anatomy.py), sent with the interval's all-reduce
        self.sums = torch.zeros(len(task.stat_names), dtype=torch.float64, device=runtime.device)
        self.losses: list[torch.Tensor] = []
        self.loss_steps: list[int] = []
        self.pending: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]] = []  # (outputs, targets, loss), one shape
        self.pending_elements = 0
        self.batched = bool(getattr(task, "batched_stats", False))  # a duck-typed task may not say
        self.steps = 0  # optimizer steps in the open interval
        self.started = time.perf_counter()
        self.in_flight: InFlight | None = None
        self.epoch_sums = [0.0] * len(task.stat_names)
        self.stop_agreed = False

    def add(self, stats: torch.Tensor, loss: torch.Tensor, step: int) -> None:
        """One micro-step's sums and detached loss (``step``: the optimizer step it belongs to). Device ops only."""
        self.sums += stats
        self.losses.append(loss)
        self.loss_steps.append(step)

    def add_step(self, outputs: Any, targets: Any, loss: torch.Tensor, step: int) -> None:
        """One micro-step's outputs, targets and detached loss (``step``: the optimizer step it belongs to): its sums
        now, or, when they are small tensors of a task with ``batched_stats``, with the interval's others at its
        end (:meth:`fold`). Device ops only; none per step in the second case."""
        if not (self.batched and isinstance(outputs, torch.Tensor) and isinstance(targets, torch.Tensor)
                and outputs.numel() <= BATCHED_MAX_ELEMENTS):
            self.add(self.task.stats(outputs, targets, loss), loss, step)
            return
        if self.pending and (self.pending[0][0].shape != outputs.shape or self.pending[0][1].shape != targets.shape
                             or self.pending_elements >= PENDING_MAX_ELEMENTS):
            self.fold()  # concatenated batches share a shape (equal counts: the mean loss stands for each)
        self.pending.append((outputs.detach(), targets, loss))
        self.pending_elements += outputs.numel()
        self.losses.append(loss)
        self.loss_steps.append(step)

    def fold(self) -> None:
        """Add the waiting steps' sums: one ``stats`` call over their batches concatenated, with their mean loss."""
        if not self.pending:
            return
        pending, self.pending, self.pending_elements = self.pending, [], 0
        if len(pending) == 1:
            outputs, targets, loss = pending[0]
        else:
            outputs = torch.cat([p[0] for p in pending])
            targets = torch.cat([p[1] for p in pending])
            loss = torch.stack([p[2] for p in pending]).mean()
        self.sums += self.task.stats(outputs, targets, loss)

    def new_epoch(self) -> None:
        self.epoch_sums = [0.0] * len(self.epoch_sums)

    def close_and_reduce(self, step: int, epoch: int, lr: float, stop_requested: bool) -> None:
        """End the open interval at ``step`` and start its all-reduce (the one in flight, if any, is read first)."""
        self.read_reduction()
        self.fold()
        device = self.runtime.device
        total = (torch.stack(self.losses).sum(dtype=torch.float64) if self.losses
                 else torch.zeros((), dtype=torch.float64, device=device))
        flag = torch.full((1,), float(stop_requested), dtype=torch.float64, device=device)  # a fill: no copy
        now = time.perf_counter()
        parts = [self.sums, total.reshape(1), flag]
        if self.clock is not None:
            parts.append(self._anatomy_slots(now - self.started))
        vector = torch.cat(parts)
        self.sums.zero_()
        self.in_flight = InFlight(vector, collectives.all_reduce_sum(vector, self.runtime, async_op=True),
                                  self.losses, self.loss_steps, step, self.steps, epoch, now - self.started, lr,
                                  time.time())
        self.losses, self.loss_steps, self.steps, self.started = [], [], 0, now

    def _anatomy_slots(self, wall_s: float) -> torch.Tensor:
        """Every rank's anatomy slots, this rank's filled (the all-reduce's sum fills the others'). Host numbers
        copied to the device without waiting for it (pinned memory, non-blocking)."""
        runtime = self.runtime
        slots = torch.zeros(ANATOMY_SLOTS * runtime.world_size, dtype=torch.float64)
        start = ANATOMY_SLOTS * runtime.rank
        slots[start:start + ANATOMY_SLOTS] = torch.tensor([*self.clock.take(), wall_s], dtype=torch.float64)
        if runtime.device.type == "cuda":
            return slots.pin_memory().to(runtime.device, non_blocking=True)
        return slots.to(runtime.device)

    def flush(self, step: int, epoch: int, lr: float, stop_requested: bool) -> None:
        """Reduce and record everything now: the interval in flight, then the open one if it has steps."""
        if self.steps:
            self.close_and_reduce(step, epoch, lr, stop_requested)
        self.read_reduction()

    def read_reduction(self) -> None:
        """Read the interval in flight (waiting for its all-reduce): write its record, stop on a non-finite loss,
        take the stop flag. The host sync of the log interval."""
        done, self.in_flight = self.in_flight, None
        if done is None:
            return
        with self.heartbeat.in_phase("log interval: metrics/NaN/stop all-reduce"):
            if done.work is not None:
                done.work.wait()
            values = done.reduced.tolist()
        count = len(self.task.stat_names)
        sums, (loss_total, stop), slots = values[:count], values[count:count + 2], values[count + 2:]
        if not math.isfinite(loss_total):
            self._raise_nonfinite(done)
        self.epoch_sums = [a + b for a, b in zip(self.epoch_sums, sums, strict=True)]
        self.stop_agreed = self.stop_agreed or stop > 0
        names = self.task.stat_names
        samples = sums[names.index("samples")] if "samples" in names else 0
        record = {"split": "train", "step": done.step, "epoch": done.epoch, **self.task.metrics(sums),
                  "samples_per_s": samples / done.elapsed if done.elapsed > 0 else 0.0, "lr": done.lr,
                  "time": done.time}
        if "tokens" in names:  # a token-level task: how many tokens its loss counted, and how fast
            tokens = sums[names.index("tokens")]
            record.update(tokens=int(tokens), tokens_per_s=tokens / done.elapsed if done.elapsed > 0 else 0.0)
        if slots:
            record[step_anatomy.KEY] = [
                step_anatomy.figures(slots[i:i + ANATOMY_SLOTS - 1], slots[i + ANATOMY_SLOTS - 1], done.steps)
                for i in range(0, len(slots), ANATOMY_SLOTS)]
        self.emit(record)

    def epoch_means(self) -> dict[str, float] | None:
        """The current epoch's metrics over every sample of its recorded intervals (None before the first)."""
        names = self.task.stat_names
        if "samples" in names and not self.epoch_sums[names.index("samples")]:
            return None
        return self.task.metrics(self.epoch_sums)

    def _raise_nonfinite(self, done: InFlight) -> None:
        """Every rank saw a non-finite loss total: each finds its own first non-finite step, they agree on the
        earliest (MIN), and the run stops naming it."""
        finite = torch.isfinite(torch.stack(done.losses)).tolist() if done.losses else []
        mine = next((s for s, ok in zip(done.loss_steps, finite, strict=True) if not ok), NO_NONFINITE)
        first = torch.tensor([mine], dtype=torch.int64, device=self.runtime.device)
        collectives.all_reduce_min(first, self.runtime)
        raise JobFailed(
            f"the loss became NaN or inf at step {int(first.item())}; the run stopped without saving that state.",
            "Lower optim.lr, set trainer.clip_grad_norm (e.g. 1.0), or use precision bf16/fp32 instead of fp16; "
            "then resume from the last checkpoint with --resume auto.",
            retryable=False,  # a restart from the last checkpoint replays the same steps
        )
