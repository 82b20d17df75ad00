"""Where this rank's step time goes (``trainer.anatomy``): host clocks around the step's phases, no host sync.

The trainer adds seconds to four phases as it steps (:mod:`mgpucli.run_records.step_anatomy` says what each one
means); the log interval takes them at its end and sends them with its one all-reduce, each rank in its own slots
of the vector (the others add zeros), so every rank's figures reach the record without another collective.

The gradient communication that did not overlap with backward is measured with a DDP communication hook (the
public ``register_comm_hook``): it launches each bucket's all-reduce exactly as DDP's default does (torch's
``allreduce_hook``) and notes when the last one was handed over; backward returns only once every bucket is
reduced, so the time from that hand-over to backward's return is the wait. A rank that arrives first waits there for
the last one; the last one barely waits.
"""

from __future__ import annotations

import time
from typing import Any

import torch
from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook

from mgpucli.run_records import step_anatomy


class StepClock:
    """This rank's seconds per phase since the last :meth:`take`: data, compute, comm, optimizer."""

    def __init__(self):
        self.seconds = [0.0, 0.0, 0.0, 0.0]
        self.handed_over: float | None = None  # when the last gradient bucket went to communication

    def watch_ddp(self, ddp_model: torch.nn.Module) -> None:
        """Time the gradient all-reduce's tail on this DDP model (the hook reduces as DDP's default does)."""
        ddp_model.register_comm_hook(self, _timed_allreduce)

    def add_data(self, seconds: float) -> None:
        self.seconds[0] += seconds

    def add_backward(self, started: float, ended: float) -> None:
        """Forward+backward from ``started`` to ``ended``: the tail after the last hand-over is comm."""
        handed, self.handed_over = self.handed_over, None
        tail = min(max(ended - handed, 0.0), ended - started) if handed is not None else 0.0
        self.seconds[1] += ended - started - tail
        self.seconds[2] += tail

    def add_optimizer(self, seconds: float) -> None:
        self.seconds[3] += seconds

    def take(self) -> list[float]:
        """The seconds since the last take, and start again."""
        out, self.seconds = self.seconds, [0.0, 0.0, 0.0, 0.0]
        return out


def _timed_allreduce(clock: StepClock, bucket):
    clock.handed_over = time.perf_counter()
    return allreduce_hook(None, bucket)


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
