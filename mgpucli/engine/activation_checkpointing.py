"""Activation checkpointing: chosen blocks keep only their inputs in forward and recompute the rest in backward,
trading compute for activation memory. The same for every strategy (single, dp, ddp, fsdp).

``trainer.activation_checkpointing``: ``true`` takes the blocks FSDP shards (``trainer.fsdp.wrap``'s classes
under fsdp, else every block of any ``nn.ModuleList``, the rule :func:`select_blocks` applies to both), or a list
of module class names (``[Block]``). ``trainer.fsdp.activation_checkpointing: true`` is the same as ``true``. A
Hugging Face Transformers model given ``true`` uses its own gradient checkpointing
(``gradient_checkpointing_enable``, non-reentrant), which knows its layers' arguments.
torch's non-reentrant checkpoint restores the RNG state for the recomputation, so dropout draws the same masks
and the gradients are the ones computed without it.
"""

from __future__ import annotations

from functools import partial

from torch import nn

from mgpucli.model_facts import blocks_to_checkpoint as blocks_to_checkpoint  # the rules, shared with the recipe check
from mgpucli.model_facts import select_blocks as select_blocks


def checkpoint_model(model: nn.Module, trainer_cfg) -> int:
    """Apply ``trainer.activation_checkpointing`` to ``model``; returns the number of blocks that recompute."""
    blocks = blocks_to_checkpoint(model, trainer_cfg)
    if not blocks:
        return 0
    chosen = trainer_cfg.activation_checkpointing
    by_name = not isinstance(chosen, bool) and bool(chosen)  # a list of class names: exactly those blocks
    if not by_name and getattr(model, "supports_gradient_checkpointing", False):
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    else:
        checkpoint_blocks(blocks)
    return len(blocks)


def checkpoint_blocks(blocks: list[nn.Module]) -> None:
    """Make each block's forward a non-reentrant ``torch.utils.checkpoint``; parameter names are unchanged, so
    checkpoints load with it on or off."""
    from torch.utils.checkpoint import checkpoint

    for block in blocks:
        block.forward = partial(checkpoint, block.forward, use_reentrant=False)
