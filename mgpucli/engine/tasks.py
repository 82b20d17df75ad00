"""Tasks: the loss, and metrics as sums that add up exactly across batches and ranks.

A task turns a batch's outputs and targets into a vector of sums (``stat_names``); ``metrics`` turns summed
vectors into metric values. Sums, not means, so that batches and ranks combine exactly. A custom task is any
``_target_`` object with the same four members (subclass :class:`Task`).
"""

from __future__ import annotations

import functools
import math

import torch
import torch.nn.functional as F


class Task:
    """Base class: ``loss`` (a mean, for backward), ``stats`` (sums), ``metrics`` (from summed stats)."""

    stat_names: tuple[str, ...] = ("loss_sum", "samples")

    def loss(self, outputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def stats(self, outputs: torch.Tensor, targets: torch.Tensor, loss: torch.Tensor | None = None) -> torch.Tensor:
        """A float64 vector of sums over the batch. ``loss`` (the batch mean) may be reused during training."""
        raise NotImplementedError

    def step_stats(self, outputs: torch.Tensor, targets: torch.Tensor, loss: torch.Tensor):
        """One training step's sums, as cheaply as the task can give them (``loss``: the batch mean, detached).

        The default is :meth:`stats`, a float64 vector the trainer adds at once. A task may return instead a
        sequence aligned with ``stat_names`` of device scalars, host numbers (summed exactly),
        ``(device scalar, host number)`` pairs meaning their product, or :class:`Later` pieces; the trainer adds
        them up in float64 at the log interval. A step then costs only the tensor ops it cannot avoid: each op
        costs microseconds of dispatch however small its data, which matters on short steps.
        """
        return self.stats(outputs, targets, loss)

    def metrics(self, sums: list[float]) -> dict[str, float]:
        raise NotImplementedError


class Later:
    """A :meth:`Task.step_stats` piece computed at the log interval for many steps at once: ``fn(*tensors)``
    on each tensor concatenated (dim 0) over the steps, one op sequence per interval instead of one per step.
    ``fn`` must return the sum over whatever batch it is given. It keeps the tensors until then, so tasks use it
    for small ones only (the trainer falls back to one call per step where they don't concatenate)."""

    __slots__ = ("fn", "tensors")

    def __init__(self, fn, *tensors: torch.Tensor):
        self.fn, self.tensors = fn, tensors


_LATER_MAX_ELEMENTS = 1 << 14  # outputs up to 16k elements (64 KB in float32) wait for the interval


def _f32(t: torch.Tensor) -> torch.Tensor:
    """``t.float()`` where it converts: on float32 outputs (no autocast) the call returns ``t`` itself, through
    ~1 us of dispatch a training step would pay for nothing."""
    return t if t.dtype is torch.float32 else t.float()


def _correct(outputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    return (outputs.argmax(dim=-1) == targets).sum()


@functools.lru_cache(maxsize=256)
def _constant(value: float, device: torch.device) -> torch.Tensor:
    """A float64 scalar on ``device``, made once (torch.full: a fill kernel, no host-to-device copy) and reused:
    the counts in a stats vector (batch size, tokens) repeat step after step. Never modified in place."""
    return torch.full((), value, dtype=torch.float64, device=device)


def _vec(device: torch.device, *values: torch.Tensor | float) -> torch.Tensor:
    """Stack scalars (tensors or numbers) into one float64 vector on ``device``.

    One ``stack`` does it: next to a float64 value it promotes float32 sums and integer counts to float64
    exactly (the same values as converting each first), so a training step pays one op here, not three per value.
    """
    parts = [(v.detach() if v.dim() == 0 else v.detach().reshape(())) if isinstance(v, torch.Tensor)
             else _constant(float(v), device) for v in values]
    if not any(p.dtype == torch.float64 for p in parts):  # promotion alone would stop short of float64
        parts = [p.to(torch.float64) for p in parts]
    return torch.stack(parts)


class Classification(Task):
    """Cross-entropy loss; metrics ``loss`` and ``accuracy``."""

    stat_names = ("loss_sum", "correct", "samples")

    def loss(self, outputs, targets):
        return F.cross_entropy(_f32(outputs), targets)

    def stats(self, outputs, targets, loss=None):
        n = targets.shape[0]
        loss_sum = loss.detach() * n if loss is not None else F.cross_entropy(outputs.float(), targets,
                                                                               reduction="sum")
        return _vec(outputs.device, loss_sum, _correct(outputs.detach(), targets), n)

    def step_stats(self, outputs, targets, loss):
        n, outputs = targets.shape[0], outputs.detach()
        # Small outputs (where dispatch, not arithmetic, is the cost): count the correct ones at the interval.
        correct = (Later(_correct, outputs, targets) if outputs.numel() <= _LATER_MAX_ELEMENTS
                   else _correct(outputs, targets))
        return (loss, n), correct, n

    def metrics(self, sums):
        loss_sum, correct, n = sums
        return {"loss": loss_sum / max(n, 1), "accuracy": correct / max(n, 1)}


class Regression(Task):
    """Mean squared error loss; metrics ``loss`` (MSE), ``mse`` and ``mae``."""

    stat_names = ("sq_err_sum", "abs_err_sum", "elements", "samples")

    def loss(self, outputs, targets):
        return F.mse_loss(_f32(outputs).reshape(targets.shape), _f32(targets))

    def stats(self, outputs, targets, loss=None):
        diff = outputs.detach().float().reshape(targets.shape) - targets.float()
        return _vec(outputs.device, (diff * diff).sum(), diff.abs().sum(), float(diff.numel()), float(targets.shape[0]))

    def metrics(self, sums):
        sq, ab, elements, _ = sums
        mse = sq / max(elements, 1)
        return {"loss": mse, "mse": mse, "mae": ab / max(elements, 1)}


class LanguageModel(Task):
    """Token cross-entropy over (batch, time, vocab) logits; metrics ``loss`` (per token) and ``perplexity``."""

    stat_names = ("loss_sum", "tokens", "samples")

    def loss(self, outputs, targets):
        return F.cross_entropy(_f32(outputs).flatten(0, -2), targets.flatten())

    def stats(self, outputs, targets, loss=None):
        tokens = targets.numel()
        if loss is not None:
            loss_sum = loss.detach() * tokens
        else:
            loss_sum = F.cross_entropy(outputs.float().flatten(0, -2), targets.flatten(), reduction="sum")
        return _vec(outputs.device, loss_sum, tokens, targets.shape[0])

    def step_stats(self, outputs, targets, loss):
        tokens = targets.numel()
        return (loss, tokens), tokens, targets.shape[0]

    def metrics(self, sums):
        loss_sum, tokens, _ = sums
        loss = loss_sum / max(tokens, 1)
        return {"loss": loss, "perplexity": math.exp(min(loss, 700.0))}


BUILTIN = {"classification": Classification, "regression": Regression, "language_model": LanguageModel}


def build_task(spec) -> Task:
    """A built-in task by name, or a ``_target_`` component."""
    if isinstance(spec, str):
        return BUILTIN[spec]()
    from mgpucli.config.targets import build

    return build(spec)
