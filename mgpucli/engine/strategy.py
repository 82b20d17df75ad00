"""Strategies: how the model is wrapped for the job's process count (single, ddp, dp, fsdp)."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from mgpucli.distributed.runtime import Runtime
from mgpucli.engine.activation_checkpointing import checkpoint_model, select_blocks
from mgpucli.errors import UsageError


@dataclass
class Wrapped:
    """The model as trained (``train``), as evaluated (``eval``), and unwrapped for state dicts (``raw``)."""

    train: nn.Module
    eval: nn.Module
    raw: nn.Module
    strategy: str
    checkpointed: int = 0  # blocks whose activations are recomputed in backward (activation checkpointing)

    @property
    def is_ddp(self) -> bool:
        return self.strategy == "ddp"

    @property
    def is_fsdp(self) -> bool:
        return self.strategy == "fsdp"


def resolve_strategy(name: str, runtime: Runtime) -> str:
    """``auto``: ddp with more than one process, else single. Combinations that can't work are exit 2."""
    if name == "auto":
        return "ddp" if runtime.world_size > 1 else "single"
    if name == "dp":
        if runtime.device.type != "cuda":
            raise UsageError(
                "trainer.strategy=dp (nn.DataParallel) needs CUDA GPUs, and this process has none.",
                "Use trainer.strategy=ddp (or auto) with `mgpu launch --cpu --nproc N`, or run on a GPU machine.",
            )
        if runtime.world_size > 1:
            raise UsageError(
                f"trainer.strategy=dp is one process spanning the GPUs, but {runtime.world_size} processes were "
                "started.",
                "Run it as a single process (mgpu launch starts one for dp), or use trainer.strategy=ddp.",
            )
    if name == "single" and runtime.world_size > 1:
        raise UsageError(
            f"trainer.strategy=single trains on one process, but {runtime.world_size} were started.",
            "Use trainer.strategy=ddp (or auto) for several processes.",
        )
    if name in ("ddp", "fsdp") and runtime.world_size == 1:
        return "single"  # one process: nothing to replicate or shard
    return name


def check_combinations(trainer_cfg, runtime: Runtime) -> None:
    """Options that only make sense together: exit 2 with the fix instead of a crash deep in torch."""
    strategy = trainer_cfg.strategy
    fsdp = trainer_cfg.fsdp
    fsdp_set = [k for k, default in (("wrap", None), ("reshard_after_forward", True),
                                     ("activation_checkpointing", False), ("cpu_offload", False))
                if fsdp[k] != default]
    if fsdp_set and strategy != "fsdp":
        other = (" (activation checkpointing for any strategy: trainer.activation_checkpointing=true)"
                 if fsdp_set[0] == "activation_checkpointing" else "")
        raise UsageError(
            f"trainer.fsdp.{fsdp_set[0]} is set, but trainer.strategy={strategy}: FSDP options need strategy fsdp.",
            f"Set trainer.strategy=fsdp, or drop the trainer.fsdp options{other}.",
        )
    if trainer_cfg.checkpoint_format == "sharded" and strategy != "fsdp":
        raise UsageError(
            f"trainer.checkpoint_format=sharded needs trainer.strategy=fsdp (got {strategy}).",
            "Use checkpoint_format=auto (the default: full checkpoints with other strategies) or full.",
        )
    fmt = trainer_cfg.checkpoint_format
    if trainer_cfg.async_save and (fmt == "full" or (fmt == "auto" and strategy != "fsdp")):
        why = "checkpoint_format=full" if fmt == "full" else f"checkpoint_format=auto with strategy {strategy}"
        raise UsageError(
            f"trainer.async_save writes sharded checkpoints in the background, but this run writes full ones ({why}).",
            "Drop trainer.async_save, or train with trainer.strategy=fsdp (sharded checkpoints by default).",
        )
    if strategy == "fsdp" and trainer_cfg.sync_batchnorm:
        raise UsageError("trainer.sync_batchnorm is a DDP option; FSDP does not convert BatchNorm layers.",
                         "Use trainer.strategy=ddp with sync_batchnorm, or drop sync_batchnorm.")
    if strategy == "fsdp" and fsdp.cpu_offload and runtime.device.type != "cuda":
        raise UsageError(
            "trainer.fsdp.cpu_offload needs CUDA GPUs: torch's FSDP offload policy moves parameters between an "
            "accelerator and the CPU, and this run is on the CPU already.",
            "Drop trainer.fsdp.cpu_offload on CPU runs (the parameters are in CPU memory anyway).",
        )


def shard_model(model: nn.Module, trainer_cfg, runtime: Runtime) -> nn.Module:
    """FSDP2 (``fully_shard``) on the chosen blocks, then the root; mixed precision follows trainer.precision."""
    import warnings

    from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy, fully_shard

    warnings.filterwarnings("ignore", message="FSDP2-wrapped module .* returned a view tensor")
    opts = trainer_cfg.fsdp
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(trainer_cfg.precision)
    kwargs = {"reshard_after_forward": opts.reshard_after_forward,
              "mp_policy": MixedPrecisionPolicy(param_dtype=dtype, reduce_dtype=torch.float32)}
    if opts.cpu_offload:
        kwargs["offload_policy"] = CPUOffloadPolicy()
    for block in select_blocks(model, opts.wrap, "trainer.fsdp.wrap"):
        fully_shard(block, **kwargs)
    return fully_shard(model, **kwargs)


def wrap_model(model: nn.Module, trainer_cfg, runtime: Runtime) -> Wrapped:
    """Move the model to its device and wrap it for the strategy; ``raw`` keeps clean state-dict keys."""
    check_combinations(trainer_cfg, runtime)
    if trainer_cfg.strategy == "fsdp" and trainer_cfg.fsdp.wrap:  # on one process too: the recipe is wrong either way
        select_blocks(model, [str(n) for n in trainer_cfg.fsdp.wrap], "trainer.fsdp.wrap")
    strategy = resolve_strategy(trainer_cfg.strategy, runtime)
    if trainer_cfg.sync_batchnorm and strategy == "ddp":
        model = nn.SyncBatchNorm.convert_sync_batchnorm(model)
    model = model.to(runtime.device)
    if trainer_cfg.channels_last:
        model = model.to(memory_format=torch.channels_last)
    checkpointed = checkpoint_model(model, trainer_cfg)  # before any wrapper: DDP, FSDP and compile see it
    raw = model
    if strategy == "ddp":
        from torch.nn.parallel import DistributedDataParallel as DDP

        ddp = trainer_cfg.ddp
        # torch 2.13 deprecates broadcast_buffers (its default, True, is what forward_sync_buffers does):
        # pass it only when the user turns it off.
        extra = {} if ddp.broadcast_buffers else {"broadcast_buffers": False}
        train = DDP(
            model,
            device_ids=[runtime.device.index] if runtime.device.type == "cuda" else None,
            find_unused_parameters=ddp.find_unused_parameters,
            gradient_as_bucket_view=ddp.gradient_as_bucket_view,
            static_graph=ddp.static_graph,
            **extra,
        )
        evaluate = model  # no gradient sync, no buffer broadcast needed to evaluate
    elif strategy == "dp":
        train = evaluate = nn.DataParallel(model)
    elif strategy == "fsdp":
        train = evaluate = raw = shard_model(model, trainer_cfg, runtime)  # sharded in place: one module
    else:
        train = evaluate = model
    if trainer_cfg.compile:
        train = torch.compile(train)  # for DDP, dynamo splits graphs at bucket boundaries (optimize_ddp)
        evaluate = train if strategy != "ddp" else torch.compile(model)
    return Wrapped(train=train, eval=evaluate, raw=raw, strategy=strategy, checkpointed=checkpointed)
