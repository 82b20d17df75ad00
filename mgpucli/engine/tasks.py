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

from mgpucli.model_facts import metric_names as metric_names  # shared with the recipe check


class Task:
    """Base class: ``loss`` (a mean, for backward), ``stats`` (sums), ``metrics`` (from summed stats)."""

    stat_names: tuple[str, ...] = ("loss_sum", "samples")
    # True: ``stats`` of several batches of one shape, concatenated on dim 0, with the mean of their losses as
    # ``loss``, equals the sum of their ``stats`` one by one. The trainer then adds a log interval's small batches
    # in one call (engine/log_interval.py). A task whose sums weigh ``loss`` by a count the shapes don't fix (e.g.
    # unmasked tokens) leaves it False: its ``stats`` runs on every step.
    batched_stats: bool = False

    def loss(self, outputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def stats(self, outputs: torch.Tensor, targets: torch.Tensor, loss: torch.Tensor | None = None) -> torch.Tensor:
        """A float64 vector of sums over the batch, on the outputs' device (no host sync: the trainer adds it up on
        the device every step). ``loss`` (the batch mean) may be reused during training."""
        raise NotImplementedError

    def metrics(self, sums: list[float]) -> dict[str, float]:
        raise NotImplementedError


def _correct(outputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    return (outputs.argmax(dim=-1) == targets).sum()


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


class Classification(Task):
    """Cross-entropy loss; metrics ``loss`` and ``accuracy``."""

    stat_names = ("loss_sum", "correct", "samples")
    batched_stats = True

    def loss(self, outputs, targets):
        return F.cross_entropy(outputs.float(), targets)

    def stats(self, outputs, targets, loss=None):
        n = targets.shape[0]
        loss_sum = loss.detach() * n if loss is not None else F.cross_entropy(outputs.float(), targets,
                                                                               reduction="sum")
        return _vec(outputs.device, loss_sum, _correct(outputs.detach(), targets), n)


    def metrics(self, sums):
        loss_sum, correct, n = sums
        return {"loss": loss_sum / max(n, 1), "accuracy": correct / max(n, 1)}


class Regression(Task):
    """Mean squared error loss; metrics ``loss`` (MSE), ``mse`` and ``mae``."""

    stat_names = ("sq_err_sum", "abs_err_sum", "elements", "samples")
    batched_stats = True

    def loss(self, outputs, targets):
        return F.mse_loss(outputs.float().reshape(targets.shape), targets.float())

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
    batched_stats = True

    def loss(self, outputs, targets):
        return F.cross_entropy(outputs.float().flatten(0, -2), targets.flatten())

    def stats(self, outputs, targets, loss=None):
        tokens = targets.numel()
        if loss is not None:
            loss_sum = loss.detach() * tokens
        else:
            loss_sum = F.cross_entropy(outputs.float().flatten(0, -2), targets.flatten(), reduction="sum")
        return _vec(outputs.device, loss_sum, tokens, targets.shape[0])


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
