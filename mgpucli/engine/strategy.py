"""Strategies: how the model is wrapped for the job's process count (single, ddp, dp)."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from mgpucli.dist.runtime import Runtime
from mgpucli.errors import UsageError


@dataclass
class Wrapped:
    """The model as trained (``train``), as evaluated (``eval``), and unwrapped for state dicts (``raw``)."""

    train: nn.Module
    eval: nn.Module
    raw: nn.Module
    strategy: str

    @property
    def is_ddp(self) -> bool:
        return self.strategy == "ddp"


def resolve_strategy(name: str, rt: Runtime) -> str:
    """``auto``: ddp with more than one process, else single. Combinations that can't work are exit 2."""
    if name == "auto":
        return "ddp" if rt.world_size > 1 else "single"
    if name == "dp":
        if rt.device.type != "cuda":
            raise UsageError(
                "trainer.strategy=dp (nn.DataParallel) needs CUDA GPUs, and this process has none.",
                "Use trainer.strategy=ddp (or auto) with `mgpu launch --cpu --nproc N`, or run on a GPU machine.",
            )
        if rt.world_size > 1:
            raise UsageError(
                f"trainer.strategy=dp is one process spanning the GPUs, but {rt.world_size} processes were started.",
                "Run it as a single process (mgpu launch starts one for dp), or use trainer.strategy=ddp.",
            )
    if name == "single" and rt.world_size > 1:
        raise UsageError(
            f"trainer.strategy=single trains on one process, but {rt.world_size} were started.",
            "Use trainer.strategy=ddp (or auto) for several processes.",
        )
    if name == "ddp" and rt.world_size == 1:
        return "single"  # DDP over one process only adds overhead
    return name


def wrap_model(model: nn.Module, trainer_cfg, rt: Runtime) -> Wrapped:
    """Move the model to its device and wrap it for the strategy; ``raw`` keeps clean state-dict keys."""
    strategy = resolve_strategy(trainer_cfg.strategy, rt)
    if trainer_cfg.sync_batchnorm and strategy == "ddp":
        model = nn.SyncBatchNorm.convert_sync_batchnorm(model)
    model = model.to(rt.device)
    if trainer_cfg.channels_last:
        model = model.to(memory_format=torch.channels_last)
    raw = model
    if strategy == "ddp":
        from torch.nn.parallel import DistributedDataParallel as DDP

        ddp = trainer_cfg.ddp
        # torch 2.13 deprecates broadcast_buffers (its default, True, is what forward_sync_buffers does):
        # pass it only when the user turns it off.
        extra = {} if ddp.broadcast_buffers else {"broadcast_buffers": False}
        train = DDP(
            model,
            device_ids=[rt.device.index] if rt.device.type == "cuda" else None,
            find_unused_parameters=ddp.find_unused_parameters,
            gradient_as_bucket_view=ddp.gradient_as_bucket_view,
            static_graph=ddp.static_graph,
            **extra,
        )
        evaluate = model  # no gradient sync, no buffer broadcast needed to evaluate
    elif strategy == "dp":
        train = evaluate = nn.DataParallel(model)
    else:
        train = evaluate = model
    if trainer_cfg.compile:
        train = torch.compile(train)  # for DDP, dynamo splits graphs at bucket boundaries (optimize_ddp)
        evaluate = train if strategy != "ddp" else torch.compile(model)
    return Wrapped(train=train, eval=evaluate, raw=raw, strategy=strategy)
