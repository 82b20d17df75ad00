"""What a run dir holds, and whether a new run may start in it (stdlib only).

The launcher checks a run dir before it starts any worker, ``--check`` and ``--dry-run`` report the same, and the
engine's rank 0 applies the same rule when it takes the run dir (``mgpu train`` also runs alone or under plain
torchrun): one rule, one message, wherever it is met first.
"""

from __future__ import annotations

import os
from pathlib import Path

from mgpucli.errors import UsageError
from mgpucli.run_layout import (
    CHECKPOINTS,
    FULL_SUFFIX,
    LAST_FULL,
    LAST_SHARDED,
    METRICS,
    SHARDED_META,
    SHARDED_SUFFIX,
    best_name,
    is_launch_json,
    last_name,
    step_glob,
)


def checkpoint_dir(run_dir: str | Path) -> Path:
    return Path(run_dir) / CHECKPOINTS


def last_checkpoint(run_dir: str | Path, sharded: bool | None = False) -> Path:
    """Where the run's latest checkpoint of a format goes (a file, or a directory of shards), there or not.
    ``sharded`` None (``trainer.checkpoint_format: auto``): the one the run dir holds, the full file when neither."""
    if sharded is None:
        link = checkpoint_dir(run_dir) / last_name(True)
        sharded = not (checkpoint_dir(run_dir) / last_name(False)).exists() and (link.exists() or link.is_symlink())
    return checkpoint_dir(run_dir) / last_name(sharded)


def requested_sharded(checkpoint_format: str) -> bool | None:
    """``trainer.checkpoint_format`` as the run-dir rule takes it: True (sharded), False (full) or None (auto: decided
    by :func:`writes_sharded` once the checkpoint a resume continues is known)."""
    return {"sharded": True, "full": False}.get(str(checkpoint_format))


def writes_sharded(checkpoint_format: str, strategy: str, resumed: str | Path | None) -> bool:
    """Whether a run writes sharded checkpoints. ``auto`` (the default): a resumed run keeps the format of the
    checkpoint it continues (one format per run dir), a new one writes sharded ones under FSDP (no rank gathers the
    whole model and optimizer state) and full ones under any other strategy."""
    chosen = requested_sharded(checkpoint_format)
    if chosen is not None:
        return chosen
    if resumed is not None:
        return Path(resumed).is_dir()
    return str(strategy) == "fsdp"


def saved_checkpoint(run_dir: str | Path, which: str = "last") -> Path | None:
    """The run's newest (``last``: what ``--resume auto`` continues from) or ``best`` checkpoint, either format: the
    full file, else a sharded run's directory holding its meta file; None when the run has none. The one lookup of
    a run's checkpoint: the post-mortem, restarts, the launcher's summary, the trackers' last record and export."""
    name = {"last": last_name, "best": best_name}[which]
    full, sharded = checkpoint_dir(run_dir) / name(False), checkpoint_dir(run_dir) / name(True)
    if full.is_file():
        return full
    return sharded if (sharded / SHARDED_META).is_file() else None


def existing_checkpoints(run_dir: str | Path) -> list[Path]:
    ckpt = checkpoint_dir(run_dir)
    return sorted([*ckpt.glob(f"*{FULL_SUFFIX}"), *ckpt.glob(f"*{SHARDED_SUFFIX}")]) if ckpt.is_dir() else []


def holds_a_run(run_dir: str | Path) -> bool:
    """True when an earlier run left its records here (a launch record, any node's, metrics or checkpoints)."""
    path = Path(run_dir)
    return _holds_launch_record(path) or (path / METRICS).is_file() or bool(existing_checkpoints(path))


def _holds_launch_record(path: Path) -> bool:
    try:
        return any(is_launch_json(entry.name) and entry.is_file() for entry in os.scandir(path))
    except OSError:
        return False


def resume_path(run_dir: str | Path, resume: str | None, sharded: bool | None = False) -> Path | None:
    """The checkpoint a start with ``--resume`` continues from (None: a fresh start; ``auto`` without one)."""
    if resume == "auto":
        last = last_checkpoint(run_dir, sharded)
        return last if last.exists() else None
    return Path(resume) if resume else None


def check_start(run_dir: str | Path, resume: str | None, overwrite: bool, sharded: bool | None = False) -> Path | None:
    """Raise UsageError when a run cannot start in ``run_dir`` as asked; else return the checkpoint it resumes.

    Refused: ``--resume`` with ``--overwrite``; an empty ``--resume``; a ``--resume`` checkpoint that does not
    exist or is no complete mgpu checkpoint (read without torch, nothing in it run); a run dir holding checkpoints
    that a fresh start would overwrite; a run dir that cannot be created or written.
    """
    if resume is not None and not resume.strip():
        raise UsageError("--resume is empty: it takes a checkpoint's path or 'auto'.",
                         f"Give a checkpoint (e.g. {last_checkpoint(run_dir, sharded)}), --resume auto, or leave "
                         "--resume out for a fresh start.")
    if resume and overwrite:
        raise UsageError(
            f"--resume {resume} and --overwrite contradict each other: one continues the run, the other deletes "
            "its checkpoints.",
            "Keep --resume to continue it, or --overwrite to start afresh.",
        )
    found = resume_path(run_dir, resume, sharded)
    if found is not None and not found.exists():
        raise UsageError(
            f"--resume {resume}: no such checkpoint{_dangling(found)}.",
            f"Give an existing checkpoint (e.g. {last_checkpoint(run_dir, sharded)}), or --resume auto to continue "
            "the run dir's latest one (a fresh start when it has none).",
        )
    if found is not None:
        from mgpucli.postmortem.checkpoint_peek import resume_problem

        problem = resume_problem(str(found))
        if problem:
            raise UsageError(f"--resume{' auto' if resume == 'auto' else ''}: {problem}.",
                             f"Resume from another checkpoint (RUN_DIR/{CHECKPOINTS}/{LAST_FULL}, a "
                             f"{step_glob(sharded=False)}, or a sharded run's {LAST_SHARDED}), or start afresh "
                             "without --resume.")
    existing = existing_checkpoints(run_dir)
    if existing and found is None and not overwrite:
        names = ", ".join(p.name for p in existing[:3]) + (", ..." if len(existing) > 3 else "")
        if resume == "auto":  # there are checkpoints, but not the one --resume auto continues from
            last = last_checkpoint(run_dir, sharded)
            raise UsageError(
                f"--resume auto continues from {last}{_dangling(last) or ', which does not exist'}; run dir "
                f"{run_dir} holds {names} (trainer.checkpoint_format={_format_name(sharded)}).",
                "Name the checkpoint to continue from (--resume PATH), start afresh with --overwrite (deletes "
                "them), or set run_dir=... (or name=...) for a new run dir.",
            )
        raise UsageError(
            f"run dir {run_dir} already holds checkpoints ({names}); a new run would overwrite them.",
            "Continue it with --resume auto, start afresh with --overwrite (deletes them), or set run_dir=... "
            "(or name=...) for a new run dir.",
        )
    problem = unwritable(run_dir)
    if problem:
        raise UsageError(f"cannot create run dir {run_dir}: {problem}.",
                         "Choose another location with run_dir=PATH (or fix the path/permissions).")
    return found


def _format_name(sharded: bool | None) -> str:
    return "auto" if sharded is None else "sharded" if sharded else "full"


def _dangling(path: Path) -> str:
    """``" (a link to X, which is gone)"`` for a symlink whose target is missing (a sharded run's ``last.dcp``
    after its step directory was deleted or moved), else ``""``."""
    return f" (a link to {os.readlink(path)}, which is gone)" if path.is_symlink() else ""


def unwritable(run_dir: str | Path) -> str | None:
    """Why ``run_dir`` cannot be created or written (without creating anything); None when it can."""
    path = Path(run_dir)
    for candidate in [path, *path.parents]:  # relative ones end at ".": named as the user gave them
        if not candidate.exists():
            continue
        if not candidate.is_dir():
            return f"{candidate} is a file, not a directory"
        if not os.access(candidate, os.W_OK | os.X_OK):
            return f"{candidate} is not writable"
        return None
    return None
