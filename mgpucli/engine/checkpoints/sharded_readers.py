"""A sharded checkpoint read outside training, in one process and without a process group: its meta
(:func:`read_meta`), the weights alone into an unsharded model (:func:`load_weights`: ``mgpu validate``, ``mgpu
export``; the optimizer state never read), and the whole of it as one full checkpoint file (:func:`to_full_file`:
``mgpu convert``, through torch's own ``dcp_to_torch_save``)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import torch

from mgpucli.engine.checkpoints.files import read_file, save_atomic
from mgpucli.engine.checkpoints.sharded import META, is_sharded, read_alone
from mgpucli.errors import CheckpointError
from mgpucli.run_layout import CHECKPOINTS, EXAMPLE_LAST_FULL, LAST_SHARDED, step_glob


def require_sharded(path: str | Path) -> Path:
    """``path`` as a sharded checkpoint's directory; a CheckpointError naming what it is instead."""
    path = Path(path)
    if not is_sharded(path):
        raise CheckpointError(f"{path} is a directory without {META}: not a sharded mgpu checkpoint.",
                              f"Give a run's RUN_DIR/{CHECKPOINTS}/{LAST_SHARDED} (or a {step_glob(sharded=True)} "
                              f"directory), or a checkpoint file such as {EXAMPLE_LAST_FULL}.")
    return path


def read_meta(path: str | Path) -> dict[str, Any]:
    """A sharded checkpoint's non-tensor state (step, recipe, ...): its ``meta.pt``, no shard read."""
    return read_file(require_sharded(path) / META)


def saved_shapes(path: str | Path, weights: str = "model") -> dict[str, tuple[int, ...]]:
    """The shape of every tensor of ``weights`` (``model`` or ``ema``) the checkpoint holds, from its metadata."""
    import torch.distributed.checkpoint as dcp

    metadata = dcp.FileSystemReader(str(require_sharded(path))).read_metadata().state_dict_metadata
    prefix = f"{weights}."
    return {key[len(prefix):]: tuple(entry.size) for key, entry in metadata.items()
            if key.startswith(prefix) and hasattr(entry, "size")}


def load_weights(model: torch.nn.Module, path: str | Path, weights: str = "model") -> None:
    """Read the whole weights (``model``, or ``ema``: the model's with every parameter's average in its place) into
    an unsharded ``model``, in this process alone, no process group used: memory bounded by the weights, the
    optimizer state never read. A model the checkpoint does not fit is a CheckpointError listing the keys, as for a
    full checkpoint."""

    from mgpucli.engine.checkpoints.files import check_model_fit

    expected = model.state_dict()
    saved = {k: torch.empty(shape, device="meta") for k, shape in saved_shapes(path, "model").items()}
    check_model_fit(expected, saved, str(path))
    parts = [("model", expected)]
    if weights == "ema":
        averaged = saved_shapes(path, "ema")
        parts.append(("ema", {k: t for k, t in expected.items() if k in averaged}))
    for name, part in parts:
        state = {name: dict(part)}
        read_alone(state, path)
        model.load_state_dict(state[name], strict=False)  # dcp loads in place; this keeps any tensor it replaced


def to_full_file(path: str | Path, out: str | Path) -> dict[str, Any]:
    """Write the sharded checkpoint at ``path`` as one full mgpu checkpoint file ``out`` (what
    ``trainer.checkpoint_format=full`` writes: ``mgpu validate``, ``mgpu export``, ``--resume`` and
    ``torch.load(weights_only=True)`` read it). torch's own ``dcp_to_torch_save`` reads the shards; the whole state
    is in this process's memory once. Returns the checkpoint's meta."""
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

    meta = read_meta(path)
    out = Path(out)
    tmp = out.with_name(f".{out.name}.shards-{os.getpid()}")
    try:
        dcp_to_torch_save(str(path), str(tmp))
        tensors = read_file(tmp)
    finally:
        tmp.unlink(missing_ok=True)
    model = tensors["model"]
    full = {k: v for k, v in meta.items() if k != "extra"}
    full.update(model=model, optimizer=tensors["optimizer"])
    if "ema" in tensors:
        full["ema"] = {key: tensors["ema"].get(key, value) for key, value in model.items()}
    save_atomic(full, out, step=meta.get("step"))
    return meta
