"""Training state in and out of checkpoints: model/optimizer through torch.distributed.checkpoint.state_dict
(full state dicts, optimizer keyed by parameter name, the same for every strategy), RNG states per rank, and
the resume checks (is it mgpu's, does the model fit, what changed in the recipe).
"""

from __future__ import annotations

import platform
import random
from pathlib import Path
from typing import Any

import numpy as np
import torch
import yaml

from mgpucli import __version__
from mgpucli.engine.checkpoint import FORMAT_VERSION, check_model_fit, is_mgpu_checkpoint, normalize_keys, read_file
from mgpucli.errors import CheckpointError


def _dcp():
    """torch.distributed.checkpoint.state_dict, imported at the first save or load rather than with the trainer:
    its imports (DTensor's) need not delay the first training step."""
    from torch.distributed.checkpoint import state_dict

    return state_dict


def _full():
    return _dcp().StateDictOptions(full_state_dict=True, cpu_offload=True)


def _load():
    return _dcp().StateDictOptions(full_state_dict=True)


def capture_rng(device: torch.device) -> dict[str, Any]:
    """This process's RNG states as checkpoint-safe values (plain ints and tensors: weights_only loads them)."""
    name, key, pos, has_gauss, gauss = np.random.get_state()
    np_state = {"bit_generator": name, "key": [int(k) for k in key], "pos": int(pos), "has_gauss": int(has_gauss),
                "gauss": float(gauss)}
    return {
        "torch": torch.get_rng_state(),
        "cuda": torch.cuda.get_rng_state(device) if device.type == "cuda" else None,
        "numpy": np_state,
        "python": random.getstate(),
    }


def restore_rng(state: dict[str, Any], device: torch.device) -> None:
    torch.set_rng_state(state["torch"])
    if device.type == "cuda" and state.get("cuda") is not None:
        torch.cuda.set_rng_state(state["cuda"], device)
    n = state["numpy"]
    np.random.set_state((n["bit_generator"], np.array(n["key"], dtype=np.uint32), n["pos"], n["has_gauss"],
                         n["gauss"]))
    version, internal, gauss = state["python"]
    random.setstate((version, tuple(internal), gauss))


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def model_state(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return _dcp().get_model_state_dict(model, options=_full())


def optimizer_state(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> dict[str, Any]:
    return _dcp().get_optimizer_state_dict(model, optimizer, options=_full())


def load_model_state(model: torch.nn.Module, state: dict[str, Any], source: str) -> None:
    """Load (normalised) weights after checking that every key and shape fits."""
    state = normalize_keys(state)
    check_model_fit(model.state_dict(), state, source)
    _dcp().set_model_state_dict(model, state, options=_load())


def load_optimizer_state(model: torch.nn.Module, optimizer: torch.optim.Optimizer, state: dict[str, Any]) -> None:
    _dcp().set_optimizer_state_dict(model, optimizer, optim_state_dict=state, options=_load())


def versions() -> dict[str, str]:
    return {"mgpu": __version__, "torch": str(torch.__version__), "python": platform.python_version()}


def build_payload(**fields: Any) -> dict[str, Any]:
    return {"mgpu_format": FORMAT_VERSION, "versions": versions(), **fields}


def read_mgpu_checkpoint(path: str | Path) -> dict[str, Any]:
    """Read a checkpoint for resuming; CheckpointError when it isn't one of mgpu's."""
    ckpt = read_file(path, map_location="cpu")
    if not is_mgpu_checkpoint(ckpt):
        what = type(ckpt).__name__
        raise CheckpointError(
            f"{path} is not an mgpu checkpoint (it holds a {what} without mgpu's fields), so it cannot be resumed.",
            "Resume from RUN_DIR/checkpoints/last.pt; to start from plain weights, load them in your model code.",
        )
    return ckpt


def _flatten(node: Any, prefix: str = "") -> dict[str, Any]:
    if isinstance(node, dict):
        out: dict[str, Any] = {}
        for k, v in node.items():
            out.update(_flatten(v, f"{prefix}{k}."))
        return out
    return {prefix[:-1]: node}


def recipe_changes(saved_yaml: str, current_yaml: str) -> list[str]:
    """Keys whose values differ between the checkpoint's recipe and the current one."""
    old, new = _flatten(yaml.safe_load(saved_yaml) or {}), _flatten(yaml.safe_load(current_yaml) or {})
    return sorted(k for k in set(old) | set(new) if old.get(k, "<absent>") != new.get(k, "<absent>"))
