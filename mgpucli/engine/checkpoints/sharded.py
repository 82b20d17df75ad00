"""Sharded checkpoints (``trainer.checkpoint_format: sharded``, and ``auto``'s under FSDP): a
torch.distributed.checkpoint directory for models too big to gather on one rank.

Every rank writes its shard into a temporary directory, all ranks meet at a barrier, then rank 0 writes the
non-tensor state (step, epoch, RNG, loader position, recipe...) as ``meta.pt`` inside it, renames it to
``step-NNNNNNNN.dcp`` and flips the ``last.dcp`` symlink to it (``os.replace`` of a symlink is atomic), so a
crash mid-save never leaves a half checkpoint under a final name. With ``trainer.async_save`` the shards are
written by dcp's thread and rank 0 does the same once that write has ended (:class:`AsyncSave`); a failed write,
either way, is a DiskWriteError and the previous checkpoint stays the run's.

Outside training, :mod:`mgpucli.engine.checkpoints.sharded_readers` reads them (``mgpu validate``, ``mgpu export``,
``mgpu convert``).
"""

from __future__ import annotations

import errno
import os
import shutil
import threading
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from mgpucli.distributed import collectives
from mgpucli.distributed.runtime import Runtime, background_group
from mgpucli.engine.checkpoints.files import ZIP_WRITE_FAILED, read_file, save_atomic
from mgpucli.errors import CheckpointError
from mgpucli.run_layout import (
    BEST_SHARDED,
    CHECKPOINTS,
    LAST_SHARDED,
    SHARDED_META,
    step_glob,
    step_name,
)

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
                 extra: dict[str, dict[str, torch.Tensor]] | None = None, in_background: bool = False,
                 held_until: Callable[[], bool] = lambda: False) -> AsyncSave | None:
    """Collective: every rank calls it. ``extra``: more named state dicts of (sharded) tensors to save beside the
    model and the optimizer (the EMA's); meta's ``extra`` lists their names. ``in_background``
    (``trainer.async_save``): each rank's state is copied (staged) and written by a thread of
    ``torch.distributed.checkpoint``'s async save while training goes on; the returned :class:`AsyncSave` commits
    it (``last.dcp``) once every rank's part is on disk, and ``wait()`` says how it ended. ``held_until``: when the
    test-only ``hold_async_save`` fault lets the commit go on (a stop signal arrived)."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict

    name = step_name(step, sharded=True)
    tmp = ckpts / f".{name}.tmp"
    if runtime.is_main and tmp.exists():
        shutil.rmtree(tmp)  # a stale one from a killed writer
    collectives.barrier(runtime)
    model_sd, optim_sd = get_state_dict(model, optimizer)
    extra = extra or {}
    state = {"model": model_sd, "optimizer": optim_sd, **extra}
    meta = {**meta, "extra": sorted(extra)}
    commit = _Commit(ckpts, name, tmp, meta, step, keep, best, runtime.is_main)
    if in_background:
        group = background_group()
        future = dcp.async_save(state, checkpoint_id=str(tmp), process_group=group, no_dist=group is None)
        return AsyncSave(future, commit, held_until)
    try:
        dcp.save(state, checkpoint_id=str(tmp))  # raises on every rank when any rank's write failed
    except (Exception, dcp.CheckpointException) as err:  # noqa: BLE001 - CheckpointException is a BaseException
        commit.discard()
        raise _failed(commit.ckpts / name, err, "") from None
    collectives.barrier(runtime)  # every shard is on disk
    commit()
    return None


class _Commit:
    """Rank 0 makes a written checkpoint the run's: its meta, the rename to ``step-N.dcp``, ``last.dcp`` (and
    ``best.dcp``) flipped, older ones pruned. Called once every rank's shards are on disk."""

    def __init__(self, ckpts: Path, name: str, tmp: Path, meta: dict[str, Any], step: int, keep: int, best: bool,
                 is_main: bool):
        self.ckpts, self.name, self.tmp, self.meta, self.step = ckpts, name, tmp, meta, step
        self.keep, self.best, self.is_main = keep, best, is_main

    def __call__(self) -> None:
        if not self.is_main:
            return
        save_atomic(self.meta, self.tmp / META, step=self.step)
        final = self.ckpts / self.name
        if final.exists():
            shutil.rmtree(final)
        os.replace(self.tmp, final)
        _flip(self.ckpts / LAST_SHARDED, self.name)
        if self.best:
            _flip(self.ckpts / BEST_SHARDED, self.name)
        _prune(self.ckpts, self.keep)

    def discard(self) -> None:
        if self.is_main:
            shutil.rmtree(self.tmp, ignore_errors=True)


class AsyncSave:
    """A sharded checkpoint being written in the background. When dcp's write ends on rank 0 (which is after every
    rank's shards are on disk), its thread commits it; a failed write leaves the previous checkpoint the run's."""

    def __init__(self, future, commit: _Commit, held_until: Callable[[], bool]):
        self.step, self.path = commit.step, commit.ckpts / commit.name
        self._commit, self._error, self._held_until = commit, None, held_until
        self._done = threading.Event()
        future.add_done_callback(self._finish)

    def _finish(self, future) -> None:  # in dcp's thread
        try:
            future.result()
            from mgpucli import faults

            faults.hold("hold_async_save", self._held_until, step=self.step)  # test-only: inert without MGPU_FAULT
            self._commit()
        except BaseException as err:  # noqa: BLE001 - said by wait(), in the training thread
            self._error = err
            self._commit.discard()
        finally:
            self._done.set()

    def done(self) -> bool:
        return self._done.is_set()

    def wait(self) -> None:
        """Until the save has ended; a DiskWriteError (exit 1) when it failed: the previous checkpoint is kept."""
        self._done.wait()
        if self._error is not None:
            raise _failed(self.path, self._error, " in the background (trainer.async_save)")


def _failed(path: Path, error: BaseException, how: str) -> Exception:
    """The DiskWriteError (exit 1) of a sharded save that failed, on every rank alike: rank 0 says it."""
    from mgpucli.engine.checkpoints.files import DiskWriteError

    failed = DiskWriteError(
        f"could not write checkpoint {path}{how}: {_why(error)}. The previous checkpoint is kept.",
        "Free disk space (or point run_dir at a larger, writable disk), then continue with --resume auto.",
        retryable=False,
    )
    failed.same_on_every_rank = True  # dcp gives every rank every rank's causes
    return failed


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


def read_alone(state: dict[str, Any], path: str | Path) -> None:
    """Read the checkpoint's tensors named in ``state`` into it, in place, in this process alone (no process group:
    the readers outside training, :mod:`mgpucli.engine.checkpoints.sharded_readers`)."""
    import torch.distributed.checkpoint as dcp

    dcp.load(state, checkpoint_id=str(path), no_dist=True)


def _why(error: BaseException) -> str:
    """A failed save's cause in one line: each failing rank's own error (``torch.distributed.checkpoint``'s
    CheckpointException carries them, with tracebacks no user needs), "the disk is full" for ENOSPC."""
    failures = getattr(error, "failures", None)  # CheckpointException: {rank: (exception, traceback)}
    causes = {rank: got[0] if isinstance(got, tuple) else got for rank, got in failures.items()} \
        if isinstance(failures, dict) and failures else {None: error}
    said = []
    for rank, cause in sorted(causes.items(), key=lambda item: -1 if item[0] is None else item[0]):
        full = getattr(cause, "errno", None) == errno.ENOSPC or bool(ZIP_WRITE_FAILED.search(str(cause)))
        text = "the disk is full" if full else " ".join(str(cause).split())[:200] or type(cause).__name__
        said.append(text if rank is None else f"rank {rank}: {text}")
    return "; ".join(said)
