"""A lost node costs no step: the survivors of an elastic job keep the last step every rank completed.

When a node is lost (its launcher and workers killed, a pod evicted, the network cut), every rank still running fails
in its next collective. Under DDP (and the single-process strategies) each of them holds the whole model and optimizer
state, and that state is the same on every rank and well defined: a rank's state is the one after its last optimizer
step, and that step's gradients were all-reduced over every rank (the all-reduce finished on this rank, which needs
every rank's contribution), so each rank applies, or would have applied, the same update from the same state. A
failure never splits an optimizer step: DDP's all-reduce ends in backward, before the step, and the step itself is
local. So the first survivor to see the failure writes that state as the run's ``last.pt``, and the restart on the
nodes still there continues from it (:meth:`mgpucli.engine.trainer.Trainer.rescue`).

What is guaranteed, precisely: the checkpoint holds the model, optimizer, scheduler, scaler, EMA and early-stopping
state after optimizer step S, where S is the last step whose gradient all-reduce finished on the writing rank, with the
epoch's data position after S (the samples of the epoch's order every rank together consumed by then): the restart
trains step S + 1 on exactly the samples the lost step would have used. Two survivors can hold different S (a ring
all-reduce can finish on one rank and fail on another when the peer dies between): both states are valid, and the
newer one is kept. Not kept: the per-rank RNG and loader states (a rescued resume goes on from the data position, on
any process count), the train records of the log interval in progress (its all-reduce never finished: the epoch's
mean leaves those steps out), and a validation in progress (the resumed run goes on with the next epoch).

Not written: under FSDP (each rank holds only its shards, and the lost node's are gone: the restart continues from the
latest checkpoint), with ``trainer.checkpoint_format=sharded``, when this rank's weights hold a non-finite value (a
NaN whose interval was never checked: the latest checkpoint is the last one known good), and when ``last.pt`` already
holds step S or a later one.

Several survivors may see the failure at once, on this node and on others: they take turns on a lock file beside the
checkpoints (``fcntl.flock``, which network file systems that serve a shared run dir honour), each writes only a newer
step than ``last.pt`` holds, atomically (:func:`mgpucli.engine.checkpoints.files.save_atomic`), so ``last.pt`` is
always whole and ends at the newest step any survivor held. A survivor waiting for the lock does not exit: torch's
agent ends the workers of a failed attempt only once one of them has exited, so the writer is never cut short by it.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
from pathlib import Path
from typing import Any

from mgpucli.engine.checkpoints.files import save_atomic

LOCK_NAME = ".rescue.lock"  # beside the checkpoints: the survivors' turns at writing last.pt


def write_if_newer(payload: dict[str, Any], path: Path, step: int) -> bool:
    """Write ``payload`` (the state after optimizer step ``step``) to ``path`` unless it already holds ``step`` or a
    later one; survivors take turns (see the module). Returns whether this call wrote it."""
    from mgpucli.postmortem.checkpoint_peek import read_checkpoint_info

    path.parent.mkdir(parents=True, exist_ok=True)
    with _turn(path.parent / LOCK_NAME):
        held = read_checkpoint_info(str(path)) if path.exists() else None
        if held is not None and held.step >= step:
            return False
        save_atomic(payload, path, step=step)
        return True


@contextlib.contextmanager
def _turn(lock: Path):
    fd = os.open(lock, os.O_CREAT | os.O_RDWR, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # releases the lock (so does this process's death)
