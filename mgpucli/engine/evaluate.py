"""Exact evaluation, shared by training's validation and ``mgpu validate``.

Fixed global batches (see data.FixedBatches); each rank fills the rows of its batches in a table of per-batch
sums; one all-reduce fills the table (every row is non-zero on exactly one rank, and x + 0 is exact); the rows
are then added in batch order in plain Python. Every process count runs the same forward passes on the same
batches and adds in the same order, so the metrics are bitwise identical on 1 and N processes (CPU, same
per-process thread count).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn
from torch.utils.data import DataLoader

from mgpucli.distributed import collectives
from mgpucli.distributed.runtime import Runtime
from mgpucli.engine.checkpoints import state as engine_state
from mgpucli.engine.data import FixedBatches, to_device
from mgpucli.engine.tasks import Task, forward_batch_of


@torch.no_grad()
def evaluate_exact(model: nn.Module, loader: DataLoader, batches: FixedBatches, task: Task, runtime: Runtime,
                   autocast_dtype: torch.dtype | None = None, lockstep: bool = False) -> dict[str, Any]:
    """Metrics over every sample exactly once, plus ``samples``. Leaves the RNG and the model's mode as found.

    ``lockstep`` (FSDP: every forward all-gathers parameters, a collective): ranks with fewer batches repeat
    a forward pass whose result is discarded, so every rank runs the same number of forwards.
    """
    # Building a loader iterator draws from the RNG: training must not notice.
    rng = engine_state.capture_rng(runtime.device)
    was_training = model.training
    model.eval()
    table = torch.zeros(batches.num_batches, len(task.stat_names), dtype=torch.float64, device=runtime.device)
    forward_batch = forward_batch_of(task)
    batch = None
    try:
        for batch_id, batch in zip(batches.batch_ids, loader, strict=True):
            batch = to_device(batch, runtime.device, non_blocking=runtime.device.type == "cuda")
            with torch.autocast(runtime.device.type, dtype=autocast_dtype, enabled=autocast_dtype is not None):
                outputs, targets = forward_batch(model, batch)
            table[batch_id] = task.stats(outputs, targets)
        if lockstep:
            most = -(-batches.num_batches // runtime.world_size)
            if batch is None and most:  # no batch at all on this rank: borrow sample 0 for the dummy passes
                batch = to_device(loader.collate_fn([loader.dataset[0]]), runtime.device, False)
            for _ in range(most - len(batches.batch_ids)):
                with torch.autocast(runtime.device.type, dtype=autocast_dtype, enabled=autocast_dtype is not None):
                    forward_batch(model, batch)  # discarded: keeps the parameter all-gathers in step with the others
    finally:
        model.train(was_training)
        engine_state.restore_rng(rng, runtime.device)
    rows = collectives.all_reduce_sum(table, runtime).tolist()
    sums = [0.0] * len(task.stat_names)
    for row in rows:  # plain Python, in batch order: the same additions on every process count
        sums = [a + b for a, b in zip(sums, row, strict=True)]
    names = task.stat_names
    samples = int(sums[names.index("samples")]) if "samples" in names else batches.num_samples
    counted = {"tokens": int(sums[names.index("tokens")])} if "tokens" in names else {}  # a token-level task's
    return {**task.metrics(sums), "samples": samples, **counted}
