"""Tasks: how a batch meets the model, the loss, and metrics as sums that add up exactly across batches and ranks.

A task turns a batch into the model's outputs and the targets (``forward_batch``), the loss, and a vector of sums
(``stat_names``); ``metrics`` turns summed vectors into metric values. Sums, not means, so that batches and ranks
combine exactly. Two families: models that take one input tensor (``(inputs, targets)`` batches: classification,
regression, language_model) and models that take a dict batch and return their own loss (Hugging Face
Transformers' heads: sequence_classification, token_classification, causal_lm, masked_lm). A custom task is any
``_target_`` object with the same members (subclass :class:`Task`); one without ``forward_batch`` gets
``(inputs, targets)`` batches.
"""

from __future__ import annotations

from typing import Any

from mgpucli.engine.tasks.base import Task, forward_batch_of
from mgpucli.engine.tasks.model_outputs import CausalLM, MaskedLM, SequenceClassification, TokenClassification
from mgpucli.engine.tasks.tensors import Classification, LanguageModel, Regression
from mgpucli.model_facts import metric_names as metric_names  # shared with the recipe check

BUILTIN = {"classification": Classification, "regression": Regression, "language_model": LanguageModel,
           "sequence_classification": SequenceClassification, "token_classification": TokenClassification,
           "causal_lm": CausalLM, "masked_lm": MaskedLM}

__all__ = ["BUILTIN", "CausalLM", "Classification", "LanguageModel", "MaskedLM", "Regression",
           "SequenceClassification", "Task", "TokenClassification", "bind_task", "build_task", "forward_batch_of"]


def build_task(spec) -> Task:
    """A built-in task by name, or a ``_target_`` component."""
    if isinstance(spec, str):
        return BUILTIN[spec]()
    from mgpucli.config.targets import build

    return build(spec)


def bind_task(task: Task, model: Any) -> None:
    """Let a task read what it needs of the model (a classification head's number of labels); UsageError when they
    don't fit."""
    bind = getattr(task, "bind", None)
    if callable(bind):
        bind(model)
