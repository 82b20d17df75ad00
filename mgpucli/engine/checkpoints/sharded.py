"""Sharded checkpoints (``trainer.checkpoint_format: sharded``, FSDP): a torch.distributed.checkpoint directory
for models too big to gather on one rank.

Every rank writes its shard into a temporary directory, all ranks meet at a barrier, then rank 0 renames it to
``step-NNNNNNNN.dcp`` and flips the ``last.dcp`` symlink to it (``os.replace`` of a symlink is atomic), so a
crash mid-save never leaves a half checkpoint under a final name. The non-tensor state (step, epoch, RNG,
loader position, recipe...) is ``meta.pt`` inside the directory, written by rank 0 before the barrier.
"""

from __future__ import annotations

import os
import shutil
import warnings
from pathlib import Path
from typing import Any

import torch

from mgpucli.distributed import collectives
from mgpucli.distributed.runtime import Runtime
from mgpucli.engine.checkpoints.files import read_file, save_atomic
from mgpucli.errors import CheckpointError
from mgpucli.run_layout import BEST_SHARDED, CHECKPOINTS, LAST_SHARDED, SHARDED_META, step_glob, step_name

META = SHARDED_META
# One process (FSDP resumed on one, which trains unsharded) saves and loads without a process group: dcp says so.
warnings.filterwarnings("ignore", message="torch.distributed is disabled, unavailable or uninitialized",
                        category=UserWarning)


def _flip(link: Path, target: str) -> None:
    tmp = link.with_name(f".{link.name}.tmp-{os.getpid()}")
    tmp.unlink(missing_ok=True)
    os.symlink(target, tmp)
    os.replace(tmp, link)


def save_sharded(model: torch.nn.Module, optimizer: torch.optim.Optimizer, meta: dict[str, Any], ckpts: Path,
                 step: int, runtime: Runtime, keep: int, best: bool,
                 extra: dict[str, dict[str, torch.Tensor]] | None = None) -> Path:
    """Collective: every rank calls it. ``extra``: more named state dicts of (sharded) tensors to save beside the
    model and the optimizer (the EMA's); meta's ``extra`` lists their names. Returns the final directory."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict

    name = step_name(step, sharded=True)
    tmp, final = ckpts / f".{name}.tmp", ckpts / name
    if runtime.is_main and tmp.exists():
        shutil.rmtree(tmp)  # a stale one from a killed writer
    collectives.barrier(runtime)
    model_sd, optim_sd = get_state_dict(model, optimizer)
    extra = extra or {}
    dcp.save({"model": model_sd, "optimizer": optim_sd, **extra}, checkpoint_id=str(tmp))
    if runtime.is_main:
        save_atomic({**meta, "extra": sorted(extra)}, tmp / META, step=step)
    collectives.barrier(runtime)  # every shard is on disk
    if runtime.is_main:
        if final.exists():
            shutil.rmtree(final)
        os.replace(tmp, final)
        _flip(ckpts / LAST_SHARDED, name)
        if best:
            _flip(ckpts / BEST_SHARDED, name)
        _prune(ckpts, keep)
    return final


def _prune(ckpts: Path, keep: int) -> None:
    """Keep the directories the last and best links point to and the newest ``keep`` others."""
    pinned = {os.readlink(ckpts / n) for n in (LAST_SHARDED, BEST_SHARDED) if (ckpts / n).is_symlink()}
    numbered = sorted(p for p in ckpts.glob(step_glob(sharded=True)) if p.name not in pinned)
    for old in numbered[: max(0, len(numbered) - keep)]:
        shutil.rmtree(old, ignore_errors=True)


def is_sharded(path: Path) -> bool:
    return path.is_dir() and (path / META).exists()


def load_sharded(model: torch.nn.Module, optimizer: torch.optim.Optimizer, path: Path,
                 extra: dict[str, dict[str, torch.Tensor]] | None = None) -> dict[str, Any]:
    """Collective: read every rank's shards into the (already sharded) model and optimizer, and into the ``extra``
    state dicts the checkpoint holds (in place); returns meta."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

    if not is_sharded(path):
        raise CheckpointError(f"{path} is not a sharded mgpu checkpoint (no {META} inside).",
                              f"Point --resume at RUN_DIR/{CHECKPOINTS}/{LAST_SHARDED} or a {step_glob(sharded=True)} "
                              "directory.")
    meta = read_file(path / META)
    model_sd, optim_sd = get_state_dict(model, optimizer)
    saved = set(meta.get("extra", ()))
    state = {"model": model_sd, "optimizer": optim_sd, **{k: v for k, v in (extra or {}).items() if k in saved}}
    dcp.load(state, checkpoint_id=str(path))
    set_state_dict(model, optimizer, model_state_dict=state["model"], optim_state_dict=state["optimizer"])
    return meta
