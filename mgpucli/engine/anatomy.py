"""Where this rank's step time goes (``trainer.anatomy``): timestamps around the step's phases, no host sync per step.

The trainer adds time to four phases as it steps (:mod:`mgpucli.run_records.step_anatomy` says what each one
means); the log interval takes them at its end and sends them with its one all-reduce, each rank in its own slots
of the vector (the others add zeros), so every rank's figures reach the record without another collective.

On CPU the timestamps are host clocks (:class:`StepClock`). On a CUDA device the host runs ahead of the kernels it
queues, so :class:`EventStepClock` records CUDA events on the current stream at the compute and optimizer
boundaries and reads their intervals only when the log interval takes them (one wait, for the interval's last
event); the data wait stays a host clock (it is host work). :meth:`StepClock.for_device` picks one, once.

The gradient communication that did not overlap with backward: a post-accumulate-grad hook on every trained
parameter notes when the last gradient of a backward was computed; DDP hands each bucket to its all-reduce as its
gradients are ready, and backward returns only once every bucket is reduced, so the time from that last gradient
to backward's return is the wait (on CUDA: from the event recorded at the last gradient to the one at backward's
end, which the stream reaches once the all-reduce is done). A rank that arrives first waits there for the last
one; the last one barely waits. (DDP's communication itself is left as it is: no comm hook.)
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import torch

from mgpucli.run_records import step_anatomy


class StepClock:
    """This rank's seconds per phase since the last :meth:`take` (data, compute, comm, optimizer): host clocks."""

    @staticmethod
    def for_device(device: torch.device) -> StepClock:
        """The clock for a run on ``device``: CUDA events on a CUDA device, host clocks elsewhere."""
        return EventStepClock() if device.type == "cuda" else StepClock()

    def __init__(self):
        self.seconds = [0.0, 0.0, 0.0, 0.0]
        self.handed_over: Any = None  # when the last gradient was computed (its bucket then reduced)

    def mark(self) -> Any:
        """A timestamp at a phase boundary, for :meth:`add_backward` and :meth:`add_optimizer`."""
        return time.perf_counter()

    def watch_gradients(self, model: torch.nn.Module) -> None:
        """Note when each of ``model``'s trained parameters gets its gradient (DDP: the all-reduce's tail follows)."""
        for param in model.parameters():
            if param.requires_grad:
                param.register_post_accumulate_grad_hook(self._gradient_ready)

    def _gradient_ready(self, _param: torch.Tensor) -> None:
        self.handed_over = self.mark()

    def add_data(self, seconds: float) -> None:
        self.seconds[0] += seconds

    def add_backward(self, started: Any, ended: Any, communicated: bool = True) -> None:
        """Forward+backward from mark ``started`` to mark ``ended``: the tail after the last gradient is comm (only
        where :meth:`watch_gradients` was called: DDP on N processes; not on an accumulation's ``no_sync``
        micro-steps)."""
        handed, self.handed_over = self.handed_over, None
        self._add_backward(started, handed if communicated else None, ended)

    def _add_backward(self, started: float, handed: float | None, ended: float) -> None:
        tail = min(max(ended - handed, 0.0), ended - started) if handed is not None else 0.0
        self.seconds[1] += ended - started - tail
        self.seconds[2] += tail

    def add_optimizer(self, started: Any, ended: Any) -> None:
        """The optimizer step from mark ``started`` to mark ``ended``."""
        self.seconds[3] += ended - started

    def take(self) -> list[float]:
        """The seconds since the last take, and start again."""
        out, self.seconds = self.seconds, [0.0, 0.0, 0.0, 0.0]
        return out


class EventStepClock(StepClock):
    """:class:`StepClock` on a CUDA device: compute, comm and optimizer are intervals between CUDA events recorded
    on the current stream, kept until :meth:`take` reads them (waiting once, for the last one)."""

    def __init__(self, event: Callable[[], Any] | None = None):
        super().__init__()
        self.event = event or (lambda: torch.cuda.Event(enable_timing=True))  # a test may pass a fake
        self.backwards: list[tuple[Any, Any, Any]] = []  # (started, last gradient or None, ended) per micro-step
        self.optimizers: list[tuple[Any, Any]] = []  # (started, ended) per optimizer step

    def mark(self) -> Any:
        event = self.event()
        event.record()
        return event

    def _gradient_ready(self, _param: torch.Tensor) -> None:
        if self.handed_over is None:  # one event per backward, recorded again at each gradient: the last counts
            self.handed_over = self.event()
        self.handed_over.record()

    def _add_backward(self, started: Any, handed: Any, ended: Any) -> None:
        self.backwards.append((started, handed, ended))

    def add_optimizer(self, started: Any, ended: Any) -> None:
        self.optimizers.append((started, ended))

    def take(self) -> list[float]:
        """The seconds since the last take (the events' intervals, read now), and start again."""
        backwards, optimizers, self.backwards, self.optimizers = self.backwards, self.optimizers, [], []
        last = optimizers[-1][1] if optimizers else backwards[-1][2] if backwards else None
        if last is not None:
            last.synchronize()  # every earlier event on the stream is then done too
        for started, handed, ended in backwards:
            super()._add_backward(0.0, None if handed is None else _seconds(started, handed), _seconds(started, ended))
        for started, ended in optimizers:
            self.seconds[3] += _seconds(started, ended)
        return super().take()


def _seconds(started: Any, ended: Any) -> float:
    return started.elapsed_time(ended) / 1000.0  # CUDA events measure milliseconds


class StragglerWatch:
    """Rank 0's eye on the train records: the one-line summary when a straggler is first found (or changes)."""

    KEEP = 100  # the latest intervals looked at

    def __init__(self, num_workers: Any, pin_memory: Any, device: str):
        self.recipe = {"num_workers": num_workers, "pin_memory": pin_memory, "device": device}
        self.records: list[dict[str, Any]] = []
        self.said: tuple[int, str] | None = None

    def observe(self, record: dict[str, Any]) -> str | None:
        if record.get("split") != "train" or step_anatomy.KEY not in record:
            return None
        self.records = [*self.records[-(self.KEEP - 1):], record]
        found = step_anatomy.find_straggler(self.records)
        if found is None or (found.rank, found.cause) == self.said:
            return None
        self.said = (found.rank, found.cause)
        return step_anatomy.summary(found, **self.recipe)
