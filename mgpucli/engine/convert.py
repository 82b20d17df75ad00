"""``mgpu convert CHECKPOINT OUT``: a sharded checkpoint (``last.dcp``) as one full checkpoint file.

The shards are read by torch's own ``torch.distributed.checkpoint`` format utilities
(:func:`mgpucli.engine.checkpoints.sharded_readers.to_full_file`), in this one process, which holds the whole state
once: the file is what ``trainer.checkpoint_format=full`` writes, and ``mgpu validate``, ``mgpu export``,
``--resume`` and ``torch.load(OUT, weights_only=True)`` read it.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from mgpucli.errors import UsageError
from mgpucli.run_layout import CHECKPOINTS, LAST_SHARDED


@dataclass
class Converted:
    checkpoint: str
    step: int | None
    out: str
    bytes: int


def _check(checkpoint: str, out: str) -> tuple[Path, Path]:
    """Exit 2, nothing written, for anything but a sharded checkpoint and a new file in an existing directory."""
    source, target = Path(checkpoint), Path(out)
    example = f"RUN_DIR/{CHECKPOINTS}/{LAST_SHARDED}"
    if not source.exists():
        raise UsageError(f"{checkpoint} does not exist.", f"Give a sharded checkpoint's directory, e.g. {example}.")
    if source.is_file():
        raise UsageError(f"{checkpoint} is a file: it is one already (convert reads sharded checkpoints).",
                         "mgpu validate, mgpu export and --resume read it as it is.")
    if target.exists() or target.is_symlink():
        raise UsageError(f"{out} exists; convert writes nothing over a file.", "Choose a new OUT path (or delete it).")
    if not target.parent.is_dir():
        raise UsageError(f"{target.parent} is not a directory: nowhere to write {target.name}.",
                         "Create it first, or choose OUT in an existing directory.")
    return source, target


def convert(checkpoint: str, out: str) -> Converted:
    from mgpucli.engine.checkpoints.sharded_readers import to_full_file

    source, target = _check(checkpoint, out)
    meta = to_full_file(source, target)
    return Converted(checkpoint=str(source), step=meta.get("step"), out=str(target), bytes=target.stat().st_size)
