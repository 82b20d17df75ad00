"""An exponential moving average of the weights (``trainer.ema``), kept on every rank without communication.

After each optimizer step every rank applies ``ema = decay * ema + (1 - decay) * weights`` to its own copy, in
one fused device op (:func:`mgpucli.torch_parts.foreach_lerp_`): no host sync, no collective. Under DDP the ranks
hold the same weights after every step, so they hold the same average; under FSDP each rank averages its own shard
of every parameter (the average is sharded like the weights it follows). Until ``start_step`` the average is the weights
themselves; from then on it is updated every ``every`` steps.

Checkpoints hold the average as a full state dict beside the model's (``ema``: the EMA parameters with the
model's buffers, so it loads into the model like ``model`` does); resuming restores it exactly. Validation can
use it (``validate: true``): the EMA weights are copied into the model's parameters for the evaluation and the
model's own copied back afterwards, bitwise.
"""

from __future__ import annotations

import contextlib
from typing import Any

import torch
from torch import nn

from mgpucli.engine.checkpoints import state as engine_state
from mgpucli.torch_parts import foreach_copy_, foreach_lerp_


def _local(t: torch.Tensor) -> torch.Tensor:
    """A DTensor's local shard (an alias: in-place ops on it change the DTensor), or the tensor itself."""
    return t.to_local() if engine_state.is_distributed_tensor(t) else t


class EMA:
    """The average of ``model``'s parameters (the unwrapped or FSDP-sharded module whose parameters the optimizer
    steps), built from their current values."""

    def __init__(self, model: nn.Module, decay: float, every: int = 1, start_step: int = 0, validate: bool = False):
        self.model = model
        self.decay, self.every, self.start_step, self.validate = float(decay), int(every), int(start_step), validate
        named = list(model.named_parameters())
        self.names = [engine_state.canonical_name(model, n) for n, _ in named]
        self.params = [p for _, p in named]
        with torch.no_grad():
            self.shadow = [p.detach().clone() for p in self.params]
        self.sharded = any(engine_state.is_distributed_tensor(p) for p in self.params)

    def _locals(self) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
        """(parameters, averages) as plain tensors. FSDP's shards are looked up each time: FSDP may replace a
        parameter's local tensor (at its lazy initialisation), never the parameter."""
        if not self.sharded:
            return self.params, self.shadow
        with torch.no_grad():
            return [_local(p) for p in self.params], [_local(s) for s in self.shadow]

    @torch.no_grad()
    def update(self, step: int) -> None:
        """After optimizer step ``step`` (numbered from 1): device ops only."""
        if step <= self.start_step:
            params, shadow = self._locals()
            foreach_copy_(shadow, params)
        elif (step - self.start_step) % self.every == 0:
            params, shadow = self._locals()
            foreach_lerp_(shadow, params, 1.0 - self.decay)

    @contextlib.contextmanager
    def swapped_in(self):
        """The EMA weights in the model's parameters inside the block, the model's own (bitwise) after it."""
        params, shadow = self._locals()
        with torch.no_grad():
            backup = [p.clone() for p in params]
            self._reshard()
            foreach_copy_(params, shadow)
        try:
            yield
        finally:
            with torch.no_grad():
                self._reshard()  # FSDP keeps the root's gathered parameters after a forward: drop the EMA's
                foreach_copy_(params, backup)

    def _reshard(self) -> None:
        """Free every parameter FSDP has gathered, so the next forward gathers them from the shards again."""
        if not self.sharded:
            return
        for module in self.model.modules():
            if engine_state.is_sharded_module(module) and hasattr(module, "reshard"):
                module.reshard()

    @torch.no_grad()
    def full_state(self, model_state: dict[str, Any]) -> dict[str, Any]:
        """The checkpoint's ``ema``: ``model_state`` (the model's full state dict, {} on ranks other than 0) with
        every parameter replaced by its average. Collective under FSDP (each average is gathered): every rank
        calls it."""
        averages = {}
        for name, avg in zip(self.names, self.shadow, strict=True):
            full = avg.full_tensor() if engine_state.is_distributed_tensor(avg) else avg
            averages[name] = full.to("cpu")
        if not model_state:
            return {}
        missing = sorted(set(averages) - set(model_state))
        if missing:
            raise RuntimeError(f"EMA parameter names not in the model's state dict: {missing[:5]}")
        return {key: averages.get(key, value) for key, value in model_state.items()}

    def sharded_state(self) -> dict[str, torch.Tensor]:
        """The averages as they are (DTensors under FSDP), for torch.distributed.checkpoint to save or load in
        place."""
        return dict(zip(self.names, self.shadow, strict=True))

    @torch.no_grad()
    def load_full_state(self, state: dict[str, Any]) -> None:
        """Restore the averages from a checkpoint's ``ema`` (every rank reads the whole file)."""
        for name, avg in zip(self.names, self.shadow, strict=True):
            saved = state[name]
            if engine_state.is_distributed_tensor(avg):
                from torch.distributed.tensor import distribute_tensor

                saved = distribute_tensor(saved.to(avg.device), avg.device_mesh, avg.placements,
                                          src_data_rank=None).to_local()  # this rank's shard, without communication
            _local(avg).copy_(saved)

    @torch.no_grad()
    def restart(self) -> None:
        """Start the average from the current weights (a checkpoint without one was loaded)."""
        params, shadow = self._locals()
        foreach_copy_(shadow, params)
