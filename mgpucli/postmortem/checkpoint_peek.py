"""The step and epoch a checkpoint holds, read without torch (``mgpu doctor RUN_DIR`` never imports it).

A checkpoint file (``torch.save`` of a plain dict, see ``mgpucli.engine.checkpoint``) is a zip archive whose
``<name>/data.pkl`` entry pickles that dict; the tensors' bytes are separate entries, so ``data.pkl`` stays
small (~20 KB for the quickstart) whatever the model's size. It is read here with an unpickler that resolves no
global and loads no tensor: every class it names becomes an inert placeholder, so nothing in the file runs. A
sharded checkpoint (``last.dcp``, a directory) keeps the same dict in its ``meta.pt``.

A file that is not a complete zip (truncated, or not a checkpoint) reads as None: the atomic writes of the
checkpoint module never leave such a file under a final name, so a checkpoint that reads here is complete.
"""

from __future__ import annotations

import io
import os
import pickle
import zipfile
from dataclasses import dataclass
from typing import Any

MAX_PICKLE_BYTES = 64 * 1024 * 1024  # a data.pkl past this is not one of mgpu's (they hold no tensor bytes)
SHARDED_META = "meta.pt"  # mgpucli.engine.sharded.META


@dataclass(frozen=True)
class CheckpointInfo:
    """What ``--resume`` would continue from."""

    path: str
    step: int
    epoch: int | None
    mid_epoch: bool | None
    world_size: int | None


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
    target = os.path.join(path, SHARDED_META) if os.path.isdir(path) else path
    try:
        with zipfile.ZipFile(target) as archive:
            entry = next((i for i in archive.infolist() if i.filename.rsplit("/", 1)[-1] == "data.pkl"), None)
            if entry is None or entry.file_size > MAX_PICKLE_BYTES:
                return None
            data = archive.read(entry)
    except (OSError, zipfile.BadZipFile, zipfile.LargeZipFile, RuntimeError, ValueError, EOFError):
        return None
    try:
        payload = _NoCodeUnpickler(io.BytesIO(data)).load()
    except Exception:  # noqa: BLE001 - any malformed pickle means "not a readable checkpoint", nothing more
        return None
    if not isinstance(payload, dict) or "mgpu_format" not in payload or not _is_int(payload.get("step")):
        return None
    epoch, mid, world = payload.get("epoch"), payload.get("mid_epoch"), payload.get("world_size")
    return CheckpointInfo(path=path, step=payload["step"], epoch=epoch if _is_int(epoch) else None,
                          mid_epoch=mid if isinstance(mid, bool) else None,
                          world_size=world if _is_int(world) else None)


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)
