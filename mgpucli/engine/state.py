"""Training state in and out of checkpoints: model/optimizer as full state dicts (optimizer keyed by parameter
name, the same for every strategy), RNG states per rank, and the resume checks (is it mgpu's, does the model fit,
what changed in the recipe).

Loading goes through torch.distributed.checkpoint.state_dict (dcp). Saving does too for FSDP modules and DTensor
(or meta) parameters and buffers; plain modules (bare, under DDP, DataParallel or torch.compile) take the small
equivalent below, which spares every rank of every run importing dcp and DTensor (a few MiB each).
The plain save gives what dcp's gives (full_state_dict=True, cpu_offload=True): its key names, its CPU tensors
(CPU ones alias the live parameters and optimizer state, as dcp's do), its empty dict on ranks other than 0 under
a process group, and its one zero-gradient optimizer step when the optimizer has no state yet.
tests/unit/test_state_plain.py compares the two paths on bare, DDP, DataParallel and compiled models.
"""

from __future__ import annotations

import io
import platform
import random
import sys
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
import yaml

from mgpucli import __version__
from mgpucli.engine.checkpoint import FORMAT_VERSION, check_model_fit, is_mgpu_checkpoint, normalize_keys, read_file
from mgpucli.errors import CheckpointError
from mgpucli.run_layout import EXAMPLE_LAST_FULL


def _dcp():
    """torch.distributed.checkpoint.state_dict, imported at the first save or load that needs it (see the module
    docstring), never with the trainer: its imports (DTensor's) need not delay the first training step."""
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
    if needs_dcp(model):
        return _dcp().get_model_state_dict(model, options=_full())
    return _plain_model_state(model)


def optimizer_state(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> dict[str, Any]:
    if needs_dcp(model):
        return _dcp().get_optimizer_state_dict(model, optimizer, options=_full())
    return _plain_optimizer_state(model, optimizer)


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


# ------------------------------------------------------------------ which path: dcp for FSDP/DTensor only
_CKPT_PREFIX = "_checkpoint_wrapped_module."  # activation-checkpoint wrappers' key segment, dropped by dcp


def _isinstance_loaded(obj: Any, module: str, name: str) -> bool:
    """isinstance against a class of an already imported module (an object of it can exist only then); never
    imports it."""
    cls = getattr(sys.modules.get(module), name, None)
    return cls is not None and isinstance(obj, cls)


def is_sharded_module(m: torch.nn.Module) -> bool:
    name = type(m).__name__  # fully_shard makes classes "FSDP<Name>"; FSDP1 is FullyShardedDataParallel
    return (name == "FullyShardedDataParallel" or name.startswith("FSDP") or hasattr(m, "_fqn_modifiers")
            or _isinstance_loaded(m, "torch.distributed.fsdp", "FSDPModule")
            or _isinstance_loaded(m, "torch.distributed.fsdp", "FullyShardedDataParallel"))


def is_distributed_tensor(t: torch.Tensor) -> bool:
    return (type(t).__name__ in ("DTensor", "ShardedTensor") or t.is_meta
            or _isinstance_loaded(t, "torch.distributed.tensor", "DTensor"))


def needs_dcp(model: torch.nn.Module) -> bool:
    """True for models only dcp handles: FSDP (1 or 2) anywhere in them, DTensor/sharded or meta tensors."""
    return (any(is_sharded_module(m) for m in model.modules())
            or any(is_distributed_tensor(t) for t in (*model.parameters(), *model.buffers())))


# ------------------------------------------------------------------ the plain path: dcp's results, without dcp
def _is_wrapper(obj: Any) -> bool:
    """DDP and torch.compile wrappers, whose ``module.``/``_orig_mod.`` dcp leaves out of names (not DataParallel's)."""
    return (isinstance(obj, torch.nn.parallel.DistributedDataParallel)
            or _isinstance_loaded(obj, "torch._dynamo.eval_frame", "OptimizedModule"))


def canonical_name(model: torch.nn.Module, name: str) -> str:
    """dcp's canonical name for a state-dict key: wrapper segments dropped, walking the module tree."""
    name = name.replace(_CKPT_PREFIX, "")
    if "." not in name:
        return name
    kept, obj = [], model
    for part in name.split("."):
        if not _is_wrapper(obj):
            kept.append(part)
        if part != torch.nn.modules.module._EXTRA_STATE_KEY_SUFFIX:
            obj = getattr(obj, part)
    return ".".join(kept)


def _offload(node: Any, keep: bool = True) -> Any:
    """dcp's full-state gather for plain tensors: new dicts and lists, tensors ``.to("cpu")`` (no copy for CPU
    ones), and only these types; with ``keep`` False the same checks but nothing copied."""
    if isinstance(node, torch.Tensor):
        return node.to("cpu") if keep else None
    if node is None or isinstance(node, (int, float, str, bytes, io.BytesIO)):
        return node
    if isinstance(node, dict):
        return {k: _offload(v, keep) for k, v in node.items()}
    if isinstance(node, (list, tuple)):
        items = [_offload(v, keep) for v in node]
        return tuple(items) if isinstance(node, tuple) else items
    raise ValueError(f"Unexpected value type {type(node)}")


def _rank0_cpu(state: dict[str, Any]) -> dict[str, Any]:
    """dcp's cpu_offload: under a process group only rank 0 gets the state; the others get {}."""
    keep = not (dist.is_available() and dist.is_initialized()) or dist.get_rank() == 0
    out = _offload(state, keep)
    return out if keep else {}


@torch.no_grad()
def _plain_model_state(model: torch.nn.Module) -> dict[str, Any]:
    state = model.state_dict()
    for key in list(state):  # renamed keys move to the end, as in dcp
        fqn = canonical_name(model, key)
        if fqn != key:
            state[fqn] = state.pop(key)
    return _rank0_cpu(state)


def _init_optim_state(optimizer: torch.optim.Optimizer) -> None:
    """dcp's: an optimizer without state (and without gradients) takes one step on zero gradients at lr 0, so its
    state exists to save or load (Adam's step count becomes 1); gradients are None afterwards."""
    params = [p for g in optimizer.param_groups for p in g["params"]]
    if optimizer.state or any(p.grad is not None for p in params):
        return
    for p in params:
        if p.requires_grad:
            p.grad = torch.zeros_like(p)
    lrs = [g["lr"] for g in optimizer.param_groups if "lr" in g]
    for g in optimizer.param_groups:
        if "lr" in g:
            g["lr"] = torch.tensor(0.0) if isinstance(g["lr"], torch.Tensor) else 0.0
    optimizer.step(closure=None)
    for g in optimizer.param_groups:
        if "lr" in g:
            g["lr"] = lrs.pop(0)
    optimizer.zero_grad(set_to_none=True)


def _named_optimizer_state(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> dict[str, Any]:
    """``optimizer.state_dict()`` with parameter names for its indices (live tensors, no copies)."""
    osd = optimizer.state_dict()
    index = {p: i for i, p in enumerate(p for g in optimizer.param_groups for p in g["params"])}
    names = {index[p]: canonical_name(model, n) for n, p in model.named_parameters() if p in index}
    for group in osd["param_groups"]:
        group["params"] = [names[i] for i in group["params"]]
    return {"state": {names[i]: s for i, s in osd["state"].items()}, "param_groups": osd["param_groups"]}


@torch.no_grad()
def _plain_optimizer_state(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> dict[str, Any]:
    _init_optim_state(optimizer)
    return _rank0_cpu(_named_optimizer_state(model, optimizer))


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
