"""Where this rank's step time goes (``trainer.anatomy``): host clocks around the step's phases, no host sync.

The trainer adds seconds to four phases as it steps (:mod:`mgpucli.run_records.step_anatomy` says what each one
means); the log interval takes them at its end and sends them with its one all-reduce, each rank in its own slots
of the vector (the others add zeros), so every rank's figures reach the record without another collective.

The gradient communication that did not overlap with backward: a post-accumulate-grad hook on every trained
parameter notes when the last gradient of a backward was computed; DDP hands each bucket to its all-reduce as its
gradients are ready, and backward returns only once every bucket is reduced, so the time from that last gradient
to backward's return is the wait. A rank that arrives first waits there for the last one; the last one barely
waits. (DDP's communication itself is left as it is: no comm hook.)
"""

from __future__ import annotations

import time
from typing import Any

import torch

from mgpucli.run_records import step_anatomy


class StepClock:
    """This rank's seconds per phase since the last :meth:`take`: data, compute, comm, optimizer."""

    def __init__(self):
        self.seconds = [0.0, 0.0, 0.0, 0.0]
        self.handed_over: float | None = None  # when the last gradient was computed (its bucket then reduced)

    def watch_gradients(self, model: torch.nn.Module) -> None:
        """Note when each of ``model``'s trained parameters gets its gradient (DDP: the all-reduce's tail follows)."""
        for param in model.parameters():
            if param.requires_grad:
                param.register_post_accumulate_grad_hook(self._gradient_ready)

    def _gradient_ready(self, _param: torch.Tensor) -> None:
        self.handed_over = time.perf_counter()

    def add_data(self, seconds: float) -> None:
        self.seconds[0] += seconds

    def add_backward(self, started: float, ended: float, communicated: bool = True) -> None:
        """Forward+backward from ``started`` to ``ended``: the tail after the last gradient is comm (only where
        :meth:`watch_gradients` was called: DDP on N processes; not on an accumulation's ``no_sync`` micro-steps)."""
        handed, self.handed_over = self.handed_over, None
        tail = min(max(ended - handed, 0.0), ended - started) if handed is not None and communicated else 0.0
        self.seconds[1] += ended - started - tail
        self.seconds[2] += tail

    def add_optimizer(self, seconds: float) -> None:
        self.seconds[3] += seconds

    def take(self) -> list[float]:
        """The seconds since the last take, and start again."""
        out, self.seconds = self.seconds, [0.0, 0.0, 0.0, 0.0]
        return out


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
