"""The task protocol: how a batch meets the model, the loss, and metrics as sums that add up exactly."""

from __future__ import annotations

import functools
from typing import Any

import torch


class Task:
    """Base class: ``forward_batch`` (the model's outputs and the targets of a batch), ``loss`` (a mean, for
    backward), ``stats`` (sums), ``metrics`` (from summed stats)."""

    stat_names: tuple[str, ...] = ("loss_sum", "samples")
    # True: ``stats`` of several batches of one shape, concatenated on dim 0, with the mean of their losses as
    # ``loss``, equals the sum of their ``stats`` one by one. The trainer then adds a log interval's small batches
    # in one call (engine/log_interval.py). A task whose sums weigh ``loss`` by a count the shapes don't fix (e.g.
    # unmasked tokens) leaves it False: its ``stats`` runs on every step.
    batched_stats: bool = False

    def forward_batch(self, model: Any, batch: Any) -> tuple[Any, Any]:
        """``(outputs, targets)``: the model's outputs on ``batch`` and what ``loss`` and ``stats`` compare them
        with. This one takes ``(inputs, targets)`` batches and calls ``model(inputs)``."""
        inputs, targets = batch
        return model(inputs), targets

    def loss(self, outputs: Any, targets: Any) -> torch.Tensor:
        raise NotImplementedError

    def stats(self, outputs: Any, targets: Any, loss: torch.Tensor | None = None) -> torch.Tensor:
        """A float64 vector of sums over the batch, on the outputs' device (no host sync: the trainer adds it up on
        the device every step). ``loss`` (the batch mean) may be reused during training."""
        raise NotImplementedError

    def metrics(self, sums: list[float]) -> dict[str, float]:
        raise NotImplementedError


def forward_batch_of(task: Any):
    """``task.forward_batch``, or the ``(inputs, targets)`` one for a task written without it (a duck-typed
    ``_target_`` with only the four original members)."""
    method = getattr(task, "forward_batch", None)
    return method if callable(method) else functools.partial(Task.forward_batch, task)


@functools.lru_cache(maxsize=256)
def _constant(value: float, device: torch.device) -> torch.Tensor:
    """A float64 scalar on ``device``, made once and reused (never modified in place): the counts in a stats vector
    (batch size, tokens) repeat step after step, and a fill on the device needs no host-to-device copy."""
    return torch.full((), value, dtype=torch.float64, device=device)


def _vec(device: torch.device, *values: torch.Tensor | float) -> torch.Tensor:
    """Scalars (device tensors or host numbers) as one float64 vector on ``device``."""
    parts = [v.detach().reshape(()).to(torch.float64) if isinstance(v, torch.Tensor)
             else _constant(float(v), device) for v in values]
    return torch.stack(parts)


def _correct(outputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    return (outputs.argmax(dim=-1) == targets).sum()
