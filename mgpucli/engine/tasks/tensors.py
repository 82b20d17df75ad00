"""The tasks of models that take one input tensor and return one output tensor: ``(inputs, targets)`` batches."""

from __future__ import annotations

import math

import torch.nn.functional as F

from mgpucli.engine.tasks.base import Task, _correct, _vec


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
