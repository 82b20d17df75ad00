"""The step and epoch a checkpoint holds, read without torch (``mgpu doctor RUN_DIR`` never imports it).

A checkpoint file (``torch.save`` of a plain dict, see ``mgpucli.engine.checkpoints.files``) is a zip archive whose
``<name>/data.pkl`` entry pickles that dict; the tensors' bytes are separate entries, so ``data.pkl`` stays
small (~20 KB for the quickstart) whatever the model's size. It is read here with an unpickler that resolves no
global and loads no tensor: every class it names becomes an inert placeholder, so nothing in the file runs. A
sharded checkpoint (``last.dcp``, a directory) keeps the same dict in its ``meta.pt``.

A file that is not a complete zip (truncated, or not a checkpoint) reads as None: the atomic writes of the
checkpoint module never leave such a file under a final name, so a checkpoint that reads here is complete.
``resume_problem`` says why a file given to ``--resume`` is no checkpoint to continue from, the same way: the
launcher and ``--check`` refuse it before anything starts, and rank 0 before it touches the run dir.
"""

from __future__ import annotations

import io
import os
import pickle
import zipfile
from dataclasses import dataclass
from typing import Any

from mgpucli.batch_layout import Segment, segments_of
from mgpucli.run_layout import SHARDED_META

MAX_PICKLE_BYTES = 64 * 1024 * 1024  # a data.pkl past this is not one of mgpu's (they hold no tensor bytes)
FORMAT_VERSION = 1  # mgpucli.engine.checkpoints.files.FORMAT_VERSION: the newest format this mgpu reads


@dataclass(frozen=True)
class CheckpointInfo:
    """What ``--resume`` would continue from."""

    path: str
    step: int
    epoch: int | None
    mid_epoch: bool | None
    world_size: int | None
    segments: list[Segment]  # the process counts and batches it trained on (mgpucli.batch_layout)


class _Inert:
    """Stands for any object the pickle names (tensors, OrderedDicts, numpy scalars...): takes anything, does
    nothing."""

    def __new__(cls, *args: Any, **kwargs: Any) -> _Inert:
        return object.__new__(cls)

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        pass

    def __call__(self, *args: Any, **kwargs: Any) -> _Inert:  # what a placeholder for getattr(X, "f") returns
        return _Inert()

    def __setstate__(self, state: Any) -> None:
        pass

    def __setitem__(self, key: Any, value: Any) -> None:
        pass

    def append(self, item: Any) -> None:
        pass

    def extend(self, items: Any) -> None:
        pass


class _NoCodeUnpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:
        return _Inert

    def persistent_load(self, pid: Any) -> Any:
        return None  # a tensor's storage: its bytes are another zip entry, never read here


def read_checkpoint_info(path: str) -> CheckpointInfo | None:
    """The step (and epoch) of the mgpu checkpoint at ``path`` (a file, or a sharded checkpoint's directory);
    None when it is missing, incomplete, or not one of mgpu's."""
    payload = _payload(path)
    if not isinstance(payload, dict) or "mgpu_format" not in payload or not _is_int(payload.get("step")):
        return None
    epoch, mid, world = payload.get("epoch"), payload.get("mid_epoch"), payload.get("world_size")
    return CheckpointInfo(path=path, step=payload["step"], epoch=epoch if _is_int(epoch) else None,
                          mid_epoch=mid if isinstance(mid, bool) else None,
                          world_size=world if _is_int(world) else None, segments=segments_of(payload))


def resume_problem(path: str) -> str | None:
    """Why the checkpoint at ``path`` (an existing file or directory) cannot be resumed, read without torch and
    without running anything from the file; None when it is a complete mgpu checkpoint this mgpu reads."""
    sharded = os.path.isdir(path)
    if sharded and not os.path.isfile(os.path.join(path, SHARDED_META)):
        return f"{path} is a directory without {SHARDED_META}: not a sharded mgpu checkpoint"
    target = os.path.join(path, SHARDED_META) if sharded else path
    if os.path.getsize(target) == 0:
        return f"{target} is empty (0 bytes): it was never completely written"
    payload = _payload(path)
    if payload is _UNREADABLE:
        return f"{target} is not a checkpoint file that torch.save wrote (truncated, or another kind of file)"
    if not isinstance(payload, dict) or "mgpu_format" not in payload:
        return (f"{target} is not an mgpu checkpoint (none of mgpu's fields in it: a plain state_dict, or another "
                "program's file), so it cannot be resumed")
    version = payload["mgpu_format"]
    if not _is_int(version) or version > FORMAT_VERSION:
        return (f"{target} was written by a newer mgpu (checkpoint format {version!r}; this mgpu reads format "
                f"{FORMAT_VERSION}): upgrade mgpu to resume it")
    needed = ("step", "epoch") if sharded else ("step", "epoch", "model", "optimizer")
    missing = [key for key in needed if key not in payload]
    if missing or not _is_int(payload["step"]) or not _is_int(payload["epoch"]):
        what = f"has no {', '.join(missing)}" if missing else "holds a step or epoch that is not a number"
        return f"{target} {what}: not a complete mgpu checkpoint (edited, or written by another program)"
    return None


_UNREADABLE = object()  # what _payload returns for a file that is not a torch zip with a readable data.pkl


def _payload(path: str) -> Any:
    """The dict a checkpoint pickles (placeholders for every object it names), or _UNREADABLE."""
    target = os.path.join(path, SHARDED_META) if os.path.isdir(path) else path
    try:
        with zipfile.ZipFile(target) as archive:
            entry = next((i for i in archive.infolist() if i.filename.rsplit("/", 1)[-1] == "data.pkl"), None)
            if entry is None or entry.file_size > MAX_PICKLE_BYTES:
                return _UNREADABLE
            data = archive.read(entry)
    except (OSError, zipfile.BadZipFile, zipfile.LargeZipFile, RuntimeError, ValueError, EOFError):
        return _UNREADABLE
    try:
        return _NoCodeUnpickler(io.BytesIO(data)).load()
    except Exception:  # noqa: BLE001 - any malformed pickle means "not a readable checkpoint", nothing more
        return _UNREADABLE


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)
