"""What the recipe check and the engine both need to know about a recipe's model and task, said once: which blocks
``trainer.fsdp.wrap`` and ``trainer.activation_checkpointing`` select, and which metrics a task reports.

The launcher's pre-flight check (:mod:`mgpucli.config.components`, on a model built on the meta device) and the
engine (:mod:`mgpucli.engine.strategy`, :mod:`mgpucli.engine.early_stopping`) apply the same rules, so a recipe
the launcher accepts is one every worker accepts. Imports no torch at module top and nothing of the engine (config
imports no engine module).
"""

from __future__ import annotations

import difflib
from typing import TYPE_CHECKING, Any

from omegaconf import ListConfig

from mgpucli.errors import UsageError

if TYPE_CHECKING:
    from torch import nn


def select_blocks(model: nn.Module, names: list[str] | None, option: str) -> list[nn.Module]:
    """The submodules whose class name is in ``names`` (every one must match something), or by default every
    block of any nn.ModuleList. ``option`` is the recipe key the names came from, for the message."""
    if names:
        found = [m for m in model.modules() if type(m).__name__ in set(names) and m is not model]
        missing = set(names) - {type(m).__name__ for m in found}
        if missing:
            classes = sorted({type(m).__name__ for m in model.modules()})
            close = {m: difflib.get_close_matches(m, classes, n=1) for m in sorted(missing)}
            hints = [f"'{m}' (did you mean '{c[0]}'?)" if c else f"'{m}'" for m, c in close.items()]
            raise UsageError(f"{option} names {', '.join(hints)}, which the model doesn't contain (its module "
                             f"classes: {', '.join(classes)}).", f"Fix {option}.")
        return found
    from torch import nn

    return [child for m in model.modules() if isinstance(m, nn.ModuleList) for child in m]


def blocks_to_checkpoint(model: nn.Module, trainer_cfg) -> list[nn.Module]:
    """The blocks ``trainer.activation_checkpointing`` (or its fsdp alias) asks for; [] when it is off."""
    setting = trainer_cfg.activation_checkpointing
    fsdp = trainer_cfg.strategy == "fsdp"
    if isinstance(setting, (list, ListConfig)):
        return select_blocks(model, [str(n) for n in setting], "trainer.activation_checkpointing")
    if not setting and not (fsdp and trainer_cfg.fsdp.activation_checkpointing):
        return []
    blocks = select_blocks(model, trainer_cfg.fsdp.wrap if fsdp else None, "trainer.fsdp.wrap")
    if not blocks:
        classes = sorted({type(m).__name__ for m in model.modules() if m is not model})
        raise UsageError(
            "activation checkpointing found no blocks to checkpoint: by default it takes the blocks of the model's "
            f"nn.ModuleLists, and {type(model).__name__} has none (its module classes: {', '.join(classes)}).",
            "Name the block classes to recompute, e.g. trainer.activation_checkpointing=[Bottleneck].",
        )
    return blocks


def metric_names(task: Any) -> list[str]:
    """The metrics ``task`` reports (what ``trainer.best_metric`` may name): the keys of its metrics of unit sums."""
    return list(task.metrics([1.0] * len(task.stat_names)))


# The built-in tasks that give the model the whole dict batch, labels included, and train the loss it returns.
LABELS_TO_MODEL_TASKS = ("sequence_classification", "token_classification", "causal_lm", "masked_lm")


def loss_problem(task: Any, model: Any) -> str | None:
    """Why ``model`` can't train under ``task`` (a built-in task's name), or None: the dict-batch tasks pass the
    batch's ``labels`` to the model's ``forward``, which must take them (a Transformers model with a head does, and
    returns its loss from them); a model without a head takes none and returns no loss."""
    import inspect

    if task not in LABELS_TO_MODEL_TASKS:
        return None
    if getattr(model, "base_model", None) is model:  # a Transformers model without a head: its own base model
        why = "is a base model without a task head, which returns no loss and no logits"
    else:
        try:
            params = inspect.signature(model.forward).parameters
        except (TypeError, ValueError):
            return None
        if "labels" in params or any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()):
            return None
        why = "takes no labels in forward, so it returns no loss"
    return (f"task {task} gives the model the batch's labels and trains the loss it returns, but "
            f"{type(model).__name__} {why}: build "
            f"the model with a head (mgpucli.components.hf_models.transformers_model, head: {task}), or use a task "
            "that computes the loss from what the model returns")
