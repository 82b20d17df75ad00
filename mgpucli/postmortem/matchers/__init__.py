"""Known failure signatures: one pure matcher each, from log lines to a diagnosis with evidence and a fix.

Every matcher takes log lines (of one rank, or interleaved from several: each line knows its rank) and
returns a :class:`Match` for the first rank that shows the signature, or None. The texts matched are the
ones PyTorch, NCCL, gloo, CUDA and mgpu print (see ``tests/unit/fixtures/postmortem``). ``MATCHERS`` holds
them in priority order: for one rank, the first that matches explains it (a CUDA OOM explains the
exception that carries it; a collective timeout explains the SIGABRT NCCL's watchdog ends with; an echo of
another rank's death comes last).
"""

from __future__ import annotations

from collections.abc import Sequence

from mgpucli.postmortem.lines import LogLine
from mgpucli.postmortem.matchers.base import Match, Matcher
from mgpucli.postmortem.matchers.code import mgpu_error, nan_loss, python_exception
from mgpucli.postmortem.matchers.distributed import (
    collective_timeout,
    ddp_ready_twice,
    ddp_unused_parameters,
    peer_lost,
    ranks_disagree,
    torn_down,
)
from mgpucli.postmortem.matchers.resources import (
    address_in_use,
    cuda_oom,
    dataloader_worker,
    disk_full,
    killed_by_signal,
    signal_fix,
)
from mgpucli.postmortem.matchers.script import cuda_without_gpus, legacy_local_rank, nccl_without_gpus, nested_launcher

MATCHERS: tuple[Matcher, ...] = (
    cuda_oom, nccl_without_gpus, cuda_without_gpus, legacy_local_rank, nested_launcher, disk_full, nan_loss,
    address_in_use, ddp_unused_parameters, ddp_ready_twice, dataloader_worker, ranks_disagree, collective_timeout,
    mgpu_error, torn_down, killed_by_signal, python_exception, peer_lost,
)


def explain(lines: Sequence[LogLine]) -> Match | None:
    """The first signature, in priority order, that ``lines`` show."""
    for matcher in MATCHERS:
        found = matcher(lines)
        if found is not None:
            return found
    return None


__all__ = ["MATCHERS", "Match", "Matcher", "address_in_use", "collective_timeout", "cuda_oom", "cuda_without_gpus",
           "dataloader_worker",
           "ddp_ready_twice", "ddp_unused_parameters", "disk_full", "explain", "killed_by_signal",
           "legacy_local_rank", "mgpu_error", "nan_loss", "nccl_without_gpus", "nested_launcher", "peer_lost",
           "python_exception",
           "ranks_disagree", "signal_fix", "torn_down"]
