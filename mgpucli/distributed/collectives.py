"""The few collectives mgpu uses, each a no-op (or the identity) on one process."""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist

from mgpucli.distributed.runtime import Runtime


def all_reduce_sum(tensor: torch.Tensor, runtime: Runtime, async_op: bool = False):
    """Sum a tensor over ranks in place (no-op on one process). With ``async_op``, return the collective's
    handle (``.wait()`` before reading the tensor; None on one process) instead of the tensor."""
    if not runtime.distributed:
        return None if async_op else tensor
    work = dist.all_reduce(tensor, op=dist.ReduceOp.SUM, async_op=async_op)
    return work if async_op else tensor


def all_reduce_min(tensor: torch.Tensor, runtime: Runtime) -> torch.Tensor:
    """The minimum over ranks, in place."""
    if runtime.distributed:
        dist.all_reduce(tensor, op=dist.ReduceOp.MIN)
    return tensor


def all_gather_objects(obj: Any, runtime: Runtime) -> list[Any]:
    """Every rank's ``obj``, indexed by rank."""
    if not runtime.distributed:
        return [obj]
    out: list[Any] = [None] * runtime.world_size
    dist.all_gather_object(out, obj)
    return out


def broadcast_object(obj: Any, runtime: Runtime, src: int = 0) -> Any:
    """Rank ``src``'s ``obj`` on every rank."""
    if not runtime.distributed:
        return obj
    box = [obj]
    dist.broadcast_object_list(box, src=src)
    return box[0]


def barrier(runtime: Runtime) -> None:
    if runtime.distributed:
        dist.barrier()


def broadcast_buffers(module: torch.nn.Module, runtime: Runtime, src: int = 0) -> None:
    """Rank ``src``'s buffers (BatchNorm's running statistics...) on every rank, in place."""
    if runtime.distributed:
        for buffer in module.buffers():
            dist.broadcast(buffer, src=src)
