"""Activation checkpointing: chosen blocks keep only their inputs in forward and recompute the rest in backward,
trading compute for activation memory. The same for every strategy (single, dp, ddp, fsdp).

``trainer.activation_checkpointing``: ``true`` takes the blocks FSDP shards (``trainer.fsdp.wrap``'s classes
under fsdp, else every block of any ``nn.ModuleList``, the rule :func:`select_blocks` applies to both), or a list
of module class names (``[Block]``). ``trainer.fsdp.activation_checkpointing: true`` is the same as ``true``.
torch's non-reentrant checkpoint restores the RNG state for the recomputation, so dropout draws the same masks
and the gradients are the ones computed without it.
"""

from __future__ import annotations

import difflib
from functools import partial

from omegaconf import ListConfig
from torch import nn

from mgpucli.errors import UsageError


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


def checkpoint_blocks(blocks: list[nn.Module]) -> None:
    """Make each block's forward a non-reentrant ``torch.utils.checkpoint``; parameter names are unchanged, so
    checkpoints load with it on or off."""
    from torch.utils.checkpoint import checkpoint

    for block in blocks:
        block.forward = partial(checkpoint, block.forward, use_reentrant=False)
