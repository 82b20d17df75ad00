"""The one place that writes and reads checkpoint files.

A checkpoint is a plain dict that loads with ``torch.load(path, weights_only=True)``: tensors and plain Python
values only. Writes are atomic (temp file in the same directory, fsync, rename, fsync of the directory), so a
writer killed at any moment leaves the previous file whole. Reads never unpickle code.
"""

from __future__ import annotations

import errno
import os
import pickle
import re
import shutil
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import torch

from mgpucli.errors import CheckpointError, MgpuError
from mgpucli.run_layout import CHECKPOINTS, EXAMPLE_LAST_FULL, SHARDED_SUFFIX

FORMAT_VERSION = 1
_TMP = re.compile(r"^\..+\.tmp-\d+$")
_TMP_DIR = re.compile(rf"^\..+{re.escape(SHARDED_SUFFIX)}\.tmp$")  # a sharded checkpoint whose writers were killed
_PREFIXES = ("module.", "_orig_mod.")


class DiskWriteError(MgpuError):
    """A checkpoint could not be written (disk full, read-only...). The previous checkpoint is kept."""


def _tmp_name(path: Path) -> Path:
    return path.with_name(f".{path.name}.tmp-{os.getpid()}")


def _fsync_dir(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def save_atomic(payload: Mapping[str, Any], path: str | Path, step: int | None = None,
                committing: Callable[[], None] | None = None) -> None:
    """Write ``payload`` to ``path`` so that ``path`` is always either the old file or the complete new one.
    ``committing()`` is called once the new file is written, just before it takes ``path``'s place.

    A disk that is full (or read-only) is a DiskWriteError naming the path and the bytes needed and free: before
    writing where the previous checkpoint's size already says it won't fit, else when the write fails (torch's
    zip writer reports a full disk as a RuntimeError, not an OSError).
    """
    from mgpucli import faults

    path = Path(path)
    needed = path.stat().st_size if path.is_file() else None  # the new one is about as large as the last
    free = _free_bytes(path.parent)
    if needed is not None and free is not None and free < needed:
        raise _disk_full(path, needed, free, before=True)
    tmp = _tmp_name(path)
    try:
        with open(tmp, "wb") as fh:
            torch.save(dict(payload), fh)
            faults.maybe_fault("save", step=step, path=str(path))  # test-only; inert unless MGPU_FAULT is set
            fh.flush()
            os.fsync(fh.fileno())
        if committing is not None:
            committing()
        os.replace(tmp, path)
        _fsync_dir(path.parent)
    except OSError as err:
        written = _size(tmp)
        tmp.unlink(missing_ok=True)
        if err.errno == errno.ENOSPC:
            raise _disk_full(path, needed or written, _free_bytes(path.parent)) from None
        raise DiskWriteError(
            f"could not write checkpoint {path}: {err.strerror or err}. The previous checkpoint is kept.",
            "Point run_dir at a writable disk (or fix its permissions), then resume with --resume auto.",
        ) from None
    except RuntimeError as err:
        written = _size(tmp)
        tmp.unlink(missing_ok=True)
        if not ZIP_WRITE_FAILED.search(str(err)):
            raise
        raise _disk_full(path, needed or written, _free_bytes(path.parent)) from None
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


# torch's zip writer when the disk fills under it: "[enforce fail at inline_container.cc:...] . unexpected pos ..."
# or "PytorchStreamWriter failed writing file ...".
ZIP_WRITE_FAILED = re.compile(r"unexpected pos \d+|PytorchStreamWriter failed writing|file write failed")


def _disk_full(path: Path, needed: int | None, free: int | None, before: bool = False) -> DiskWriteError:
    need = f"needs ~{_mib(needed)}" if needed else "needs more"
    have = f", {_mib(free)} free" if free is not None else ""
    when = "not written: the disk is too full" if before else "the disk is full"
    return DiskWriteError(
        f"could not write checkpoint {path}: {when} ({need}{have} on the disk of {path.parent}). "
        "The previous checkpoint is kept.",
        "Free disk space (or point run_dir at a larger disk), then continue with --resume auto.",
        retryable=False,
    )


def _free_bytes(directory: Path) -> int | None:
    try:
        return shutil.disk_usage(directory).free
    except OSError:
        return None


def _size(path: Path) -> int | None:
    try:
        return path.stat().st_size
    except OSError:
        return None


def _mib(size: int) -> str:
    return f"{size / 2**20:.1f} MiB"


def copy_atomic(src: str | Path, dst: str | Path) -> None:
    """Copy a finished checkpoint under another name, atomically (hard link where possible)."""
    src, dst = Path(src), Path(dst)
    tmp = _tmp_name(dst)
    try:
        try:
            os.link(src, tmp)
        except OSError:
            tmp.write_bytes(src.read_bytes())
        os.replace(tmp, dst)
    except OSError as err:
        tmp.unlink(missing_ok=True)
        raise DiskWriteError(f"could not write checkpoint {dst}: {err.strerror or err}.") from None


def clean_stale_temps(directory: str | Path) -> list[Path]:
    """Remove temp files a killed writer left behind (names ``.<file>.tmp-<pid>``)."""
    directory = Path(directory)
    removed = []
    if directory.is_dir():
        for entry in directory.iterdir():
            if _TMP.match(entry.name):
                entry.unlink(missing_ok=True)
                removed.append(entry)
            elif _TMP_DIR.match(entry.name) and entry.is_dir():
                shutil.rmtree(entry, ignore_errors=True)
                removed.append(entry)
    return removed


# The modules the os functions live in on each platform: a pickle names them so (os.system is posix.system).
_OS_MODULES = ("posix.", "nt.")


def unsafe_globals(path: str | Path) -> list[str]:
    """What a checkpoint's pickle would call that ``weights_only=True`` refuses (torch's public
    ``get_unsafe_globals_in_checkpoint``, which runs nothing), named as users import them: ``os.system``."""
    try:
        found = torch.serialization.get_unsafe_globals_in_checkpoint(path)
    except Exception:  # noqa: BLE001 - not a zip checkpoint: torch's own message names the global, if any
        return []
    return [f"os.{name.split('.', 1)[1]}" if name.startswith(_OS_MODULES) else name for name in found]


def read_file(path: str | Path, map_location: str | torch.device = "cpu") -> Any:
    """``torch.load(weights_only=True)`` with every failure turned into a clear CheckpointError (a checkpoint of a
    newer mgpu's format too: its fields may mean something else)."""
    if not str(path).strip():  # Path("") would be the current directory
        raise CheckpointError(f"the checkpoint is {str(path)!r}: empty.", "Give a checkpoint file, e.g. "
                              f"{EXAMPLE_LAST_FULL}.")
    path = Path(path)
    if not path.exists():
        raise CheckpointError(f"checkpoint {path} does not exist.", "Check the path; run dirs keep them in "
                              f"RUN_DIR/{CHECKPOINTS}/.")
    if path.is_dir():
        raise CheckpointError(f"{path} is a directory, not a checkpoint file.")
    if path.stat().st_size == 0:
        raise CheckpointError(f"checkpoint {path} is empty (0 bytes): it was never completely written.")
    try:
        obj = torch.load(path, map_location=map_location, weights_only=True)
    except pickle.UnpicklingError as err:
        code = unsafe_globals(path) or re.findall(r"GLOBAL (\S+)", str(err))
        if code:
            raise CheckpointError(
                f"refused to load {path}: the checkpoint would call {', '.join(code)} from the file; it is not a "
                "plain tensor checkpoint (weights_only=True refused it). Nothing from it was executed.",
                "Only load files from sources you trust; re-save the weights as a plain state_dict.",
            ) from None
        raise CheckpointError(f"{path} is not a readable checkpoint (not a torch file, or corrupt).",
                              f"Use another checkpoint, e.g. {EXAMPLE_LAST_FULL}.") from None
    except Exception as err:  # noqa: BLE001 - unpickling garbage can raise anything (IndexError, KeyError, ...)
        reason = " ".join(str(err).split())[:200]
        raise CheckpointError(f"{path} is not a readable checkpoint (truncated or not a torch file: {reason}).",
                              f"Use another checkpoint, e.g. {EXAMPLE_LAST_FULL}.") from None
    version = obj.get("mgpu_format") if isinstance(obj, dict) else None
    if version is not None and not (isinstance(version, int) and version <= FORMAT_VERSION):
        raise CheckpointError(f"{path} was written by a newer mgpu (checkpoint format {version!r}; this mgpu reads "
                              f"format {FORMAT_VERSION}).", "Upgrade mgpu to use it.")
    return obj


def is_mgpu_checkpoint(obj: Any) -> bool:
    return isinstance(obj, dict) and "mgpu_format" in obj and isinstance(obj.get("model"), dict)


def normalize_keys(state: Mapping[str, Any]) -> dict[str, Any]:
    """Strip ``module.`` (DataParallel/DDP) and ``_orig_mod.`` (torch.compile) prefixes from state-dict keys."""
    out = {}
    for key, value in state.items():
        parts = [p for p in key.split(".")]
        while parts and parts[0] + "." in _PREFIXES:
            parts.pop(0)
        out[".".join(parts)] = value
    return out


def check_model_fit(expected: Mapping[str, torch.Tensor], loaded: Mapping[str, Any], source: str) -> None:
    """Raise a CheckpointError listing missing, unexpected and shape-mismatched keys."""
    missing = [k for k in expected if k not in loaded]
    unexpected = [k for k in loaded if k not in expected]
    mismatched = [
        f"{k} (checkpoint {tuple(loaded[k].shape)}, model {tuple(expected[k].shape)})"
        for k in expected
        if k in loaded and isinstance(loaded[k], torch.Tensor) and tuple(loaded[k].shape) != tuple(expected[k].shape)
    ]
    if not (missing or unexpected or mismatched):
        return

    def listing(title: str, keys: list[str]) -> str:
        shown = ", ".join(keys[:8]) + (f" ... (+{len(keys) - 8} more)" if len(keys) > 8 else "")
        return f"\n  {title} ({len(keys)}): {shown}" if keys else ""

    raise CheckpointError(
        f"the weights in {source} don't fit the recipe's model:"
        + listing("missing from the checkpoint", missing)
        + listing("unexpected in the checkpoint", unexpected)
        + listing("shape mismatch", mismatched),
        "Use the recipe the checkpoint was trained with (the same model section), or a matching checkpoint.",
    )
