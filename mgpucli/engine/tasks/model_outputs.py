"""The tasks of models that take a dict batch and return their own loss: Hugging Face Transformers' heads.

The batch is a dict (``input_ids``, ``attention_mask``, ``labels``, ...) passed to the model as keyword arguments;
the model returns an output with ``.logits`` and, given ``labels``, ``.loss``: its own loss is the one trained
(computed from the logits only for a model that returns none). The metrics come from the logits as sums over the
positions the loss counts: labels equal to :data:`IGNORE` (padding, a word's later sub-words, the unmasked tokens
of masked LM) count nowhere, so a token-weighted loss is exact across batches of different lengths, accumulation
steps and ranks.
"""

from __future__ import annotations

import math
from typing import Any

import torch
import torch.nn.functional as F

from mgpucli.engine.tasks.base import Task, _vec
from mgpucli.errors import UsageError

IGNORE = -100  # the label Transformers' losses skip


def logits_of(outputs: Any) -> torch.Tensor:
    """The logits of a model's output: a Transformers ``ModelOutput`` (or any mapping with ``logits``), or the
    tensor a plain model returns."""
    if isinstance(outputs, torch.Tensor):
        return outputs
    logits = outputs.get("logits") if hasattr(outputs, "get") else getattr(outputs, "logits", None)
    if logits is None:
        raise UsageError(f"the model returned a {type(outputs).__name__} without logits, which this task reads.",
                         "Use a model with a task head (model.head), or a task for what the model returns.")
    return logits


def own_loss(outputs: Any) -> torch.Tensor | None:
    """The loss the model computed itself (from ``labels`` in the batch), or None."""
    if isinstance(outputs, torch.Tensor):
        return None
    return outputs.get("loss") if hasattr(outputs, "get") else getattr(outputs, "loss", None)


class ModelOutputTask(Task):
    """Dict batches given to the model as keyword arguments; the model's own loss, else one from the logits."""

    def forward_batch(self, model, batch):
        return model(**batch), batch.get("labels")

    def loss(self, outputs, targets):
        loss = own_loss(outputs)
        if loss is not None:
            return loss
        if targets is None:
            raise UsageError("the batch has no 'labels' and the model returned no loss: there is nothing to train on.",
                             "Give the dataset a label column (or a head whose data makes labels, e.g. causal_lm).")
        return self.loss_from_logits(logits_of(outputs).float(), targets, reduction="mean")

    def loss_from_logits(self, logits: torch.Tensor, targets: torch.Tensor, reduction: str) -> torch.Tensor:
        raise NotImplementedError


def _f1_counts(predicted: torch.Tensor, targets: torch.Tensor, classes: torch.Tensor) -> torch.Tensor:
    """Per class: true positives, false positives, false negatives (3 x C counts; device ops only)."""
    pred = predicted.unsqueeze(-1) == classes
    true = targets.unsqueeze(-1) == classes
    return torch.stack([(pred & true).sum(0), (pred & ~true).sum(0), (~pred & true).sum(0)]).flatten()


def f1_score(counts: list[float], num_classes: int) -> float:
    """Binary (two classes): the F1 of class 1. More: the macro F1 over the classes that occur among the targets or
    the predictions (scikit-learn's ``f1_score(average="macro")`` over the labels seen)."""
    tp, fp, fn = counts[:num_classes], counts[num_classes:2 * num_classes], counts[2 * num_classes:]
    scores = [2 * t / (2 * t + p + n) if t + p + n else None for t, p, n in zip(tp, fp, fn, strict=True)]
    if num_classes == 2:
        return scores[1] or 0.0
    seen = [s for s in scores if s is not None]
    return sum(seen) / len(seen) if seen else 0.0


class SequenceClassification(ModelOutputTask):
    """A label per sequence (``labels``: one class id each), e.g. ``AutoModelForSequenceClassification``; metrics
    ``loss``, ``accuracy`` and ``f1`` (of class 1 with two labels, else macro). ``num_labels`` defaults to the
    model's ``config.num_labels``."""

    # per instance: one true-positive, false-positive and false-negative count per class (tp_0, tp_1, ...)
    stat_names = ("loss_sum", "correct", "samples", "tp_<class>", "fp_<class>", "fn_<class>")

    def __init__(self, num_labels: int | None = None):
        self.given_labels = num_labels
        self._classes: torch.Tensor | None = None
        self._set_labels(num_labels or 2)

    def _set_labels(self, count: int) -> None:
        self.num_labels = count
        counts = tuple(f"{kind}_{c}" for kind in ("tp", "fp", "fn") for c in range(count))
        self.stat_names = ("loss_sum", "correct", "samples", *counts)

    def bind(self, model: Any) -> None:
        """Take the number of labels from the model's config when the recipe gives none; a different number given
        is refused (exit 2)."""
        head = getattr(getattr(model, "config", None), "num_labels", None)
        if not head:
            return
        if self.given_labels is not None and self.given_labels != head:
            raise UsageError(f"task.num_labels is {self.given_labels}, but the model's head has {head} labels.",
                             "Drop task.num_labels (the model's is used), or set the model's num_labels to match.")
        self._set_labels(int(head))

    def loss_from_logits(self, logits, targets, reduction):
        return F.cross_entropy(logits, targets, reduction=reduction)

    def stats(self, outputs, targets, loss=None):
        logits = logits_of(outputs).detach()
        n = targets.shape[0]
        loss_sum = loss.detach() * n if loss is not None else self.loss_from_logits(logits.float(), targets, "sum")
        predicted = logits.argmax(dim=-1)
        if self._classes is None or self._classes.device != logits.device:
            self._classes = torch.arange(self.num_labels, device=logits.device)
        counts = _f1_counts(predicted, targets, self._classes).to(torch.float64)
        return torch.cat([_vec(logits.device, loss_sum, (predicted == targets).sum(), n), counts])

    def metrics(self, sums):
        loss_sum, correct, n = sums[:3]
        return {"loss": loss_sum / max(n, 1), "accuracy": correct / max(n, 1),
                "f1": f1_score(sums[3:], self.num_labels)}


class _TokenTask(ModelOutputTask):
    """A label per token, :data:`IGNORE` where none counts; ``shift``: position t's logits predict label t+1."""

    shift = False
    stat_names = ("loss_sum", "correct", "tokens", "samples")

    def _aligned(self, logits: torch.Tensor, targets: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        if self.shift:
            return logits[..., :-1, :], targets[..., 1:]
        return logits, targets

    def loss_from_logits(self, logits, targets, reduction):
        logits, targets = self._aligned(logits, targets)
        return F.cross_entropy(logits.flatten(0, -2), targets.flatten(), ignore_index=IGNORE, reduction=reduction)

    def stats(self, outputs, targets, loss=None):
        logits = logits_of(outputs).detach()
        aligned_logits, aligned = self._aligned(logits, targets)
        counted = aligned != IGNORE
        tokens = counted.sum()
        loss_sum = (loss.detach() * tokens if loss is not None
                    else self.loss_from_logits(logits.float(), targets, "sum"))
        correct = ((aligned_logits.argmax(dim=-1) == aligned) & counted).sum()
        return _vec(logits.device, loss_sum, correct, tokens, targets.shape[0])


class TokenClassification(_TokenTask):
    """A label per token (``labels``: a class id per token, -100 where none counts: padding, later sub-words), e.g.
    ``AutoModelForTokenClassification``; metrics ``loss`` (per labelled token) and ``accuracy`` (of labelled
    tokens)."""

    def metrics(self, sums):
        loss_sum, correct, tokens, _ = sums
        return {"loss": loss_sum / max(tokens, 1), "accuracy": correct / max(tokens, 1)}


def _lm_metrics(sums: list[float]) -> dict[str, float]:
    loss_sum, correct, tokens, _ = sums
    loss = loss_sum / max(tokens, 1)
    return {"loss": loss, "perplexity": math.exp(min(loss, 700.0)), "accuracy": correct / max(tokens, 1)}


class CausalLM(_TokenTask):
    """Next-token prediction (``labels``: the input ids, -100 at padding; the model shifts them), e.g.
    ``AutoModelForCausalLM``; metrics ``loss`` (per predicted token), ``perplexity`` and ``accuracy`` (of the next
    token)."""

    shift = True

    def metrics(self, sums):
        return _lm_metrics(sums)


class MaskedLM(_TokenTask):
    """Masked-token prediction (``labels``: the original ids at masked positions, -100 elsewhere), e.g.
    ``AutoModelForMaskedLM``; metrics ``loss`` (per masked token), ``perplexity`` and ``accuracy``."""

    def metrics(self, sums):
        return _lm_metrics(sums)
