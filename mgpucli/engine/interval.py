"""The log interval: per-step metric pieces and losses kept on the device, reduced with one collective.

Hot-path rules: no host sync per step. Each step leaves its metric pieces (Task.step_stats) and its detached
loss on the device; at the interval's last step they become one vector (the metric sums and the interval's loss
total, the NaN check), and the interval is *closed*. Closed intervals are all-reduced together (their vectors and
two control values, the stop flag and rank 0's pace, in one), asynchronously, and the next step reads them, so
the latency overlaps that step's work. Every rank reads them at the same step, so the ranks agree on a stop or a
NaN. A save, the end of an epoch, max_steps and a stop reduce and read what is closed first.

How many intervals share a reduction adapts to their pace: one where an interval takes REDUCE_EVERY_S or more,
else as many as fit in it (at most MAX_BATCH). Every record is still one log interval's exact sums, at its own
step; on short steps the records are written (and a stop or a NaN is agreed) about every REDUCE_EVERY_S instead
of every interval. An all-reduce, its wait and its read cost a fixed few hundred microseconds of wall time on
gloo whatever they carry: every 20 steps of ~1 ms (the quickstart MLP on 2 processes) that was ~2% of the step
time (benchmarks/README.md). The pace every rank uses is rank 0's, read from the reduced control values (the
other ranks add zeros: exact), so every rank picks the same number and the collectives stay in step.

:class:`LogInterval` is a part of :class:`mgpucli.engine.trainer.Trainer` (a mixin): it uses the trainer's
``rt``, ``task``, ``optimizer``, ``progress``, ``writer``, ``reporter``, ``step``, ``epoch`` and
``signal_received``, and owns the interval state that ``Trainer.setup`` creates (``acc``, ``first_bad``,
``_losses``, ``_loss_steps``, ``_step_rows``, ``_closed``, ``_batch``, ``_in_flight``, ``_acc_dirty``,
``_bad_folded``, ``_interval_start``, ``_interval_steps``), and ``epoch_sums``: the reduced sums of the epoch's
intervals so far, from which the epoch's means come (host numbers, added as each interval is logged: no extra sync).
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import Any

import torch

from mgpucli.distributed import runtime as dist_rt
from mgpucli.engine.tasks import Later, _constant
from mgpucli.errors import JobFailed

NO_BAD = 2**62  # "no non-finite step yet" (min-reducible)
FOLD_EVERY = 256  # pending losses and step pieces are folded at the latest after this many micro-steps
REDUCE_EVERY_S = 0.25  # short log intervals share one all-reduce, about this often
MAX_BATCH = 16  # log intervals one all-reduce carries at most


@dataclass(slots=True)
class Closed:
    """A log interval whose sums are made, waiting for its reduction, and what its record needs."""

    vec: torch.Tensor  # the metric sums and the loss total (float64, on the device)
    losses: list[torch.Tensor]  # the interval's pending losses, to find a non-finite one's step
    loss_steps: list[int]
    step: int
    epoch: int  # the epoch the interval's steps belong to, numbered from 1
    elapsed: float
    lr: float
    time: float


@dataclass(slots=True)
class Reduction:
    """An all-reduce in flight: the closed intervals' vectors, then the control values, in one vector."""

    flat: torch.Tensor
    work: Any  # the collective's handle (None on one process)
    intervals: list[Closed]


def intervals_per_reduction(pace: float) -> int:
    """How many log intervals the next all-reduce carries, from the pace (seconds per interval) of the last."""
    if not pace > 0 or not math.isfinite(pace):
        return 1
    return max(1, min(MAX_BATCH, int(REDUCE_EVERY_S / pace)))


def sum_step_rows(rows: list[Any], device: torch.device) -> torch.Tensor:
    """Column sums of step pieces (see Task.step_stats) as one float64 vector on ``device``."""
    return _float64_vector(column_sums(rows, device))


def column_sums(rows: list[Any], device: torch.device, stacked: Stacked | None = None) -> list[torch.Tensor]:
    """One device scalar per column of step pieces: its sum (float64, or a :class:`Later`'s own dtype).
    ``stacked``: scalars already stacked (the interval's losses), reused where a column's pairs hold them."""
    return [_sum_column(column, device, stacked) for column in zip(*rows, strict=True)]


@dataclass(slots=True)
class Stacked:
    """``torch.stack(tensors)``, made once: a column of ``(loss, n)`` pairs holds the very tensors the NaN check
    stacks (the detached losses), and a stack right after a step costs ~25 us."""

    tensors: list[torch.Tensor]
    stacked: torch.Tensor

    def of(self, tensors: list[torch.Tensor]) -> torch.Tensor:
        if len(tensors) == len(self.tensors) and all(a is b for a, b in zip(tensors, self.tensors, strict=True)):
            return self.stacked
        return torch.stack(tensors)


def _float64_vector(scalars: list[torch.Tensor]) -> torch.Tensor:
    """Scalars stacked as float64 in one op: ``stack`` promotes exactly next to a float64 value (integer counts
    and float32 sums alike); only without one does each need converting first."""
    if not any(t.dtype == torch.float64 for t in scalars):
        scalars = [t.to(torch.float64) for t in scalars]
    return torch.stack(scalars)


def _sum_column(column: tuple, device: torch.device, stacked: Stacked | None = None) -> torch.Tensor:
    """Device scalars are stacked and summed; host numbers summed exactly in Python; ``(scalar, number)`` pairs
    multiplied (the same float32 products a step would have computed); :class:`Later` pieces run once on their
    concatenated tensors. Sums in float64. The interval pays each of these ops once, and every op it avoids
    counts (an op on a cold cache right after a step costs ~10 us): one batch size is a scalar factor, not a
    copied tensor, and a host total is a cached constant."""
    parts = []
    pairs, tensors, later, numbers = _by_kind(column)
    if pairs:
        scalars, factors = map(list, zip(*pairs, strict=True))
        values = stacked.of(scalars) if stacked is not None else torch.stack(scalars)
        if factors.count(factors[0]) == len(factors):
            parts.append((values * factors[0]).sum(dtype=torch.float64))
        else:
            host = torch.tensor(factors, dtype=values.dtype if values.is_floating_point() else None)
            parts.append((values * _to(host, device)).sum(dtype=torch.float64))
    if tensors:
        parts.append(torch.stack(tensors).sum(dtype=torch.float64))
    if later:
        try:
            joined = [torch.cat(group) for group in zip(*(p.tensors for p in later), strict=True)]
            parts.append(later[0].fn(*joined))
        except RuntimeError:  # tensors that don't concatenate (other shapes): one call per step
            parts.append(torch.stack([p.fn(*p.tensors) for p in later]).sum(dtype=torch.float64))
    if numbers:
        parts.append(_constant(float(sum(numbers)), device))
    return parts[0] if len(parts) == 1 else _float64_vector(parts).sum()


def _by_kind(column: tuple) -> tuple[list, list, list, list]:
    """A column's pieces sorted in one pass: (pairs, device scalars, Later pieces, host numbers); one to three
    type checks a piece, where a list per kind cost four passes over the column."""
    pairs: list = []
    tensors: list = []
    later: list = []
    numbers: list = []
    for p in column:
        if isinstance(p, tuple):
            pairs.append(p)
        elif isinstance(p, Later):
            later.append(p)
        elif isinstance(p, torch.Tensor):
            tensors.append(p)
        else:
            numbers.append(p)
    return pairs, tensors, later, numbers


def _to(host: torch.Tensor, device: torch.device) -> torch.Tensor:
    """A host tensor on ``device`` without blocking (and without a no-op ``.to`` on the CPU)."""
    return host if device.type == "cpu" else host.to(device, non_blocking=True)


class LogInterval:
    """The Trainer's log-interval methods (see the module docstring for the state they share with it)."""

    def _reduce_and_log(self) -> dict[str, Any] | None:
        """Every interval reduced and logged, now: the ones in flight, then those closed and the steps since (at
        the end of an epoch, and when every rank stops). Returns the latest train metrics (None if there were
        none)."""
        metrics = self._finish_reduction()
        if self._interval_steps:
            self._close_interval()
        return self._reduce_closed() or metrics

    def _reduce_closed(self) -> dict[str, Any] | None:
        """The closed intervals reduced and logged now (the caller has finished any reduction in flight);
        returns the last record's metrics (None if none was closed)."""
        if not self._closed:
            return None
        self._start_reduction()
        return self._finish_reduction()

    def _close_interval(self) -> None:
        """Make the interval's vector, the metric sums and its loss total (the NaN check), with as few ops as
        possible (see _sum_column), and keep it with what its record needs until its reduction."""
        device = self.rt.device
        # Float32 losses summed in float64 cannot overflow: the total is NaN/inf exactly when one loss was, on
        # any rank once all-reduced (which step: only worked out when one was).
        stacked = Stacked(self._losses, torch.stack(self._losses)) if self._losses else None
        losses = stacked.stacked.sum(dtype=torch.float64) if stacked is not None else _constant(0.0, device)
        if self._bad_folded:  # a fold earlier in this interval (> FOLD_EVERY micro-steps) checked some already
            losses = torch.where(self.first_bad < NO_BAD, float("nan"), losses)
            self._bad_folded = False  # this interval carries first_bad's verdict; a later fold sets it again
        if self._acc_dirty or not self._step_rows:
            self._fold_rows()
            vec = torch.cat([self.acc, losses.reshape(1)])
            self.acc.zero_()
            self._acc_dirty = False
        else:  # the usual interval: the pieces' column sums and the loss total, stacked at once
            vec = _float64_vector([*column_sums(self._step_rows, device, stacked), losses])
            self._step_rows.clear()
        now = time.perf_counter()
        self._closed.append(Closed(vec, self._losses, self._loss_steps, self.step, self.epoch + 1,
                                   now - self._interval_start, self.optimizer.param_groups[0]["lr"], time.time()))
        self._losses, self._loss_steps = [], []
        self._interval_start, self._interval_steps = now, 0

    def _start_reduction(self) -> None:
        """Start the one collective of the closed intervals: their vectors and two control values (the stop flag,
        and rank 0's pace, from which every rank takes the next reduction's size).

        The all-reduce runs while the next step computes, and that step finishes it (_finish_reduction): a
        blocking one costs its whole latency on the step (~0.35 ms on 2 gloo processes here, a quarter of the
        MLP recipe's step). Every rank finishes it at the same step, so they still agree on where to stop, and a
        save, the end of an epoch or a stop finishes it first."""
        closed, self._closed = self._closed, []
        pace = sum(c.elapsed for c in closed) / len(closed) if self.rt.rank == 0 else 0.0
        control = torch.tensor([float(self.signal_received is not None), pace], dtype=torch.float64)
        flat = torch.cat([*(c.vec for c in closed), _to(control, self.rt.device)])
        self._in_flight = Reduction(flat, dist_rt.all_reduce_sum(flat, self.rt, async_op=True), closed)

    def _finish_reduction(self) -> dict[str, Any] | None:
        """Wait for the all-reduce (if one is in flight), log each interval's record, stop on a non-finite loss,
        take the stop flag and the next reduction's size. Returns the last record's metrics."""
        done, self._in_flight = self._in_flight, None
        if done is None:
            return None
        with self.progress.in_phase("log interval: metrics/NaN/stop all-reduce"):
            if done.work is not None:
                done.work.wait()
            *values, stop, pace = done.flat.tolist()
        metrics, end = None, 0
        for i, interval in enumerate(done.intervals):
            start, end = end, end + interval.vec.numel()
            sums, loss_total = values[start:end - 1], values[end - 1]
            if not math.isfinite(loss_total):
                later = done.intervals[i:]
                self._losses[:0] = [loss for c in later for loss in c.losses]
                self._loss_steps[:0] = [s for c in later for s in c.loss_steps]
                self._fold()  # every rank: finds its first non-finite step, then they agree on the earliest
                self._raise_nan()
            metrics = self.task.metrics(sums)
            self.epoch_sums = [a + b for a, b in zip(self.epoch_sums, sums, strict=True)]
            samples = sums[self.task.stat_names.index("samples")] if "samples" in self.task.stat_names else 0
            self._emit({"split": "train", "step": interval.step, "epoch": interval.epoch, **metrics,
                        "samples_per_s": samples / interval.elapsed if interval.elapsed > 0 else 0.0,
                        "lr": interval.lr, "time": interval.time})
        self.stop_agreed = self.stop_agreed or stop > 0
        self._batch = intervals_per_reduction(pace)
        return metrics

    def _fold(self) -> None:
        """Fold the pending step pieces into ``acc`` and the pending losses into ``first_bad``, on the device:
        a few ops per interval, no host sync (host numbers go host-to-device without blocking)."""
        self._fold_rows()
        if not self._losses:
            return
        finite = torch.isfinite(torch.stack(self._losses))
        steps = _to(torch.tensor(self._loss_steps, dtype=torch.int64), self.rt.device)
        self.first_bad = torch.minimum(self.first_bad, torch.where(finite, NO_BAD, steps).min())
        self._bad_folded = True
        self._losses.clear()
        self._loss_steps.clear()

    def _fold_rows(self) -> None:
        """Add the pending step pieces (see Task.step_stats) into ``acc``."""
        if self._step_rows:
            self.acc += sum_step_rows(self._step_rows, self.rt.device)
            self._acc_dirty = True
            self._step_rows.clear()

    def _check_finite(self) -> None:
        """Before a save: the closed intervals logged, and all ranks agree that no step so far produced a
        non-finite loss."""
        self._finish_reduction()
        self._reduce_closed()
        self._fold()
        with self.progress.in_phase("checkpoint: NaN check all-reduce"):
            flag = dist_rt.all_reduce_sum((self.first_bad < NO_BAD).to(torch.float64).reshape(1), self.rt)
        if flag.item():
            self._raise_nan()
        self._bad_folded = False

    def _raise_nan(self) -> None:
        first = self.first_bad.clone()
        if self.rt.distributed:
            torch.distributed.all_reduce(first, op=torch.distributed.ReduceOp.MIN)
        raise JobFailed(
            f"the loss became NaN or inf at step {int(first.item())}; the run stopped without saving that state.",
            "Lower optim.lr, set trainer.clip_grad_norm (e.g. 1.0), or use precision bf16/fp32 instead of fp16; "
            "then resume from the last checkpoint with --resume auto.",
            retryable=False,  # a restart from the last checkpoint replays the same steps
        )

    def _emit(self, record: dict[str, Any]) -> None:
        if self.writer is not None:
            self.writer.write(record)
        self.reporter.log(record)
