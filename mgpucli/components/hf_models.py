"""Hugging Face Transformers models with a task head, written as plain recipe YAML (needs ``mgpu[hf]``).

Use with the task of the same name (``task: sequence_classification``...) and a dataset that gives its batches
(:class:`mgpucli.components.hf_text.TextDataset`). The model takes the batch as keyword arguments and returns its
own loss; mgpu trains it with every guarantee of a recipe (exact validation, bitwise resume, FSDP, EMA...).
"""

from __future__ import annotations

import difflib
from typing import Any

from mgpucli.errors import UsageError

__all__ = ["transformers_model"]

# A recipe's head -> the Transformers auto class that builds it. The task of the same name trains it.
HEADS = {
    "sequence_classification": "AutoModelForSequenceClassification",
    "token_classification": "AutoModelForTokenClassification",
    "causal_lm": "AutoModelForCausalLM",
    "masked_lm": "AutoModelForMaskedLM",
}
# Arguments that name a Hub repository (checked before any worker starts, mgpucli/config/hub_check.py).
HUB_ARGUMENTS = {"name": "model"}


def head_class(head: str) -> Any:
    """The auto class of ``head``; exit 2 naming the heads for another name."""
    if head not in HEADS:
        close = difflib.get_close_matches(head, list(HEADS), n=1)
        hint = f" (did you mean '{close[0]}'?)" if close else ""
        raise UsageError(f"model.head: '{head}' is not a head mgpu builds{hint}; the heads: {', '.join(HEADS)}.",
                         "Set model.head to one of them (and task to the same name).")
    import transformers

    return getattr(transformers, HEADS[head])


def _config(name: str | None, config: dict[str, Any] | None, options: dict[str, Any]) -> Any:
    """The model's config: ``config`` (a ``model_type`` and its fields) or the one of ``name``; ``options`` on top."""
    from transformers import AutoConfig

    if config is not None:
        fields = dict(config)
        model_type = fields.pop("model_type", None)
        if not model_type:
            raise UsageError("model.config needs a model_type (bert, gpt2, llama...) and that model's fields.",
                             "Add model.config.model_type, or give model.name (a Hub id or a local directory).")
        return AutoConfig.for_model(model_type, **fields, **options)
    return AutoConfig.from_pretrained(name, **options)


def transformers_model(head: str, name: str | None = None, config: dict[str, Any] | None = None,
                       pretrained: bool = True, **options: Any) -> Any:
    """A Transformers model with a task ``head`` (sequence_classification, token_classification, causal_lm,
    masked_lm): from ``name``, a Hub id or a local directory, with its pretrained weights (``from_pretrained``;
    ``pretrained: false``: its architecture, fresh weights), or from ``config``, a ``model_type`` and its fields
    (``from_config``: fresh weights, for pre-training and tests). ``options`` set the config's fields
    (``num_labels``, ``hidden_dropout_prob``...). Weights load in float32 (``trainer.precision`` sets mixed
    precision). Under ``trainer.activation_checkpointing`` the model's own gradient checkpointing is used."""
    cls = head_class(head)
    if (name is None) == (config is None):
        raise UsageError("model: give either model.name (a Hub id or a local directory) or model.config (a "
                         "model_type and its fields), not both or neither.",
                         "e.g. model.name=bert-base-uncased, or model.config={model_type: bert, ...}.")
    import torch

    # Under the meta device (the launcher's check builds the model there) the weights would be read for nothing.
    building_only = torch.get_default_device().type == "meta"
    if name is not None and pretrained and not building_only:
        return cls.from_pretrained(name, dtype=options.pop("dtype", torch.float32), **options)
    return cls.from_config(_config(name, config, options), dtype=torch.float32)


transformers_model.hub_arguments = HUB_ARGUMENTS
