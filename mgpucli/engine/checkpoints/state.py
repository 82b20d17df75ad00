"""Training state in and out of checkpoints: model/optimizer as full state dicts (optimizer keyed by parameter
name, the same for every strategy), RNG states per rank, and the resume checks (is it mgpu's, does the model fit,
what changed in the recipe).

Saving and loading go through torch.distributed.checkpoint.state_dict's public functions (dcp) for every strategy,
imported at the first save or load: the start of training never waits on dcp's imports.
"""

from __future__ import annotations

import platform
import random
import sys
from pathlib import Path
from typing import Any

import numpy as np
import torch
import yaml

from mgpucli import __version__
from mgpucli.engine.checkpoints.files import (
    FORMAT_VERSION,
    check_model_fit,
    is_mgpu_checkpoint,
    normalize_keys,
    read_file,
)
from mgpucli.errors import CheckpointError
from mgpucli.run_layout import EXAMPLE_LAST_FULL
from mgpucli.torch_parts import is_compiled_wrapper


def _dcp():
    """torch.distributed.checkpoint.state_dict, imported at the first save or load that needs it (see the module
    docstring), never with the trainer: its imports (DTensor's) need not delay the first training step."""
    from torch.distributed.checkpoint import state_dict

    return state_dict


def _full():
    return _dcp().StateDictOptions(full_state_dict=True, cpu_offload=True)


def _load():
    return _dcp().StateDictOptions(full_state_dict=True)


def _held():
    """This process's state as it holds it, on the CPU, with no collective: the full state under DDP and the
    single-process strategies, which hold all of it (not under FSDP, whose shards are spread over the ranks)."""
    return _dcp().StateDictOptions(full_state_dict=False, cpu_offload=True)


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


def model_state(model: torch.nn.Module, alone: bool = False) -> dict[str, torch.Tensor]:
    """The full weights on the CPU, on rank 0 (``{}`` on the other ranks under a process group). ``alone``: the
    weights this process holds, on any rank, with no collective (DDP and single-process strategies only)."""
    return _dcp().get_model_state_dict(model, options=_held() if alone else _full())


def optimizer_state(model: torch.nn.Module, optimizer: torch.optim.Optimizer, alone: bool = False) -> dict[str, Any]:
    """The optimizer's full state keyed by parameter name (the same for every strategy), as ``model_state``."""
    return _dcp().get_optimizer_state_dict(model, optimizer, options=_held() if alone else _full())


def load_model_state(model: torch.nn.Module, state: dict[str, Any], source: str) -> None:
    """Load (normalised) weights after checking that every key and shape fits."""
    state = normalize_keys(state)
    check_model_fit(model.state_dict(), state, source)
    _dcp().set_model_state_dict(model, state, options=_load())


def load_optimizer_state(model: torch.nn.Module, optimizer: torch.optim.Optimizer, state: dict[str, Any]) -> None:
    if not state.get("state") and _same_group_sizes(optimizer, state.get("param_groups") or []):
        # No per-parameter state (SGD without momentum): only the groups' settings (lr...) to restore. dcp fails
        # on such a state (torch 2.13: AssertionError "Expected device to be set"), so resuming crashed.
        for group, saved in zip(optimizer.param_groups, state["param_groups"], strict=True):
            group.update({k: v for k, v in saved.items() if k != "params"})
        return
    _dcp().set_optimizer_state_dict(model, optimizer, optim_state_dict=state, options=_load())


def _same_group_sizes(optimizer: torch.optim.Optimizer, saved_groups: list[dict[str, Any]]) -> bool:
    return len(saved_groups) == len(optimizer.param_groups) and all(
        len(s.get("params", ())) == len(g["params"]) for s, g in zip(saved_groups, optimizer.param_groups, strict=True))


# ------------------------------------------------------------------ what a model holds
_CKPT_PREFIX = "_checkpoint_wrapped_module."  # activation-checkpoint wrappers' key segment, dropped by dcp


def _isinstance_loaded(obj: Any, module: str, name: str) -> bool:
    """isinstance against a class of an already imported module (an object of it can exist only then); never
    imports it."""
    cls = getattr(sys.modules.get(module), name, None)
    return cls is not None and isinstance(obj, cls)


def is_sharded_module(m: torch.nn.Module) -> bool:
    """A module ``fully_shard`` sharded (mgpu's FSDP strategy): an ``FSDPModule``."""
    return _isinstance_loaded(m, "torch.distributed.fsdp", "FSDPModule")


def is_distributed_tensor(t: torch.Tensor) -> bool:
    return t.is_meta or _isinstance_loaded(t, "torch.distributed.tensor", "DTensor")


def _is_wrapper(obj: Any) -> bool:
    """DDP and torch.compile wrappers, whose ``module.``/``_orig_mod.`` dcp leaves out of names (not DataParallel's)."""
    return isinstance(obj, torch.nn.parallel.DistributedDataParallel) or is_compiled_wrapper(obj)


def canonical_name(model: torch.nn.Module, name: str) -> str:
    """dcp's name for a parameter or buffer of ``model``: wrapper segments dropped, walking the module tree (the
    EMA keys its averages by these names, as the checkpoint keys the weights)."""
    name = name.replace(_CKPT_PREFIX, "")
    *modules, leaf = name.split(".")
    kept, obj = [], model
    for part in modules:
        if not _is_wrapper(obj):
            kept.append(part)
        obj = getattr(obj, part)
    return ".".join([*kept, leaf])


def versions() -> dict[str, str]:
    return {"mgpu": __version__, "torch": str(torch.__version__), "python": platform.python_version()}


def epoch_label(epoch: int, mid_epoch: bool) -> str:
    """A checkpoint's place in the run, with epochs numbered from 1 as everywhere a user reads them. Checkpoints
    store ``epoch`` as the number of epochs completed: ``epoch 3`` after the third, ``epoch 4, mid-epoch`` in the
    fourth."""
    return f"epoch {epoch + 1}, mid-epoch" if mid_epoch else f"epoch {epoch}"


def build_payload(**fields: Any) -> dict[str, Any]:
    return {"mgpu_format": FORMAT_VERSION, "versions": versions(), **fields}


def read_mgpu_checkpoint(path: str | Path) -> dict[str, Any]:
    """Read a checkpoint for resuming; CheckpointError when it isn't one of mgpu's."""
    ckpt = read_file(path, map_location="cpu")
    if not is_mgpu_checkpoint(ckpt):
        what = type(ckpt).__name__
        raise CheckpointError(
            f"{path} is not an mgpu checkpoint (it holds a {what} without mgpu's fields), so it cannot be resumed.",
            f"Resume from {EXAMPLE_LAST_FULL}; to start from plain weights, load them in your model code.",
        )
    return ckpt


def flatten(node: Any, prefix: str = "") -> dict[str, Any]:
    """``{"optim": {"lr": 0.1}}`` as ``{"optim.lr": 0.1}`` (lists stay values)."""
    if isinstance(node, dict):
        out: dict[str, Any] = {}
        for k, v in node.items():
            out.update(flatten(v, f"{prefix}{k}."))
        return out
    return {prefix[:-1]: node}


def recipe_changes(saved_yaml: str, current_yaml: str) -> list[str]:
    """Keys whose values differ between the checkpoint's recipe and the current one."""
    old, new = flatten(yaml.safe_load(saved_yaml) or {}), flatten(yaml.safe_load(current_yaml) or {})
    return sorted(k for k in set(old) | set(new) if old.get(k, "<absent>") != new.get(k, "<absent>"))
