"""torch's moving parts: everything mgpu takes from torch beyond its public, documented API, in one place.

When torch changes, this file is what to re-check. Nothing else in mgpu reaches into torch
(``tests/unit/test_one_place.py``): no ``torch._*`` name, no private attribute or private module of torch's, no
function of ``torch.distributed.run`` (the ``torchrun`` command's module, whose functions torch does not document),
and no torch function replaced at runtime but through :func:`replace`. Each entry says why it is here and the torch
versions it was checked on (:data:`CHECKED_ON`: the versions ``pyproject.toml`` allows, ``torch>=2.13``).

What mgpu replaces at runtime (:data:`REPLACED`) is all in a launched script's worker, which runs a script mgpu did
not write: the stall watch's view of its ``torch.distributed`` calls (:mod:`mgpucli.distributed.observed`), the
refusal of a script that launches its own ranks inside a job (:mod:`mgpucli.launch.nested`), and, with
``--audit``, the checks' public points (:mod:`mgpucli.audit`). mgpu's own recipes' workers replace nothing.

Nothing heavy at import: each function imports the torch module it uses.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

CHECKED_ON = "2.13.0"  # the torch every entry was read and tested against (requirements.txt pins it)

_OBSERVED = ("distributed/observed.py: which waiting call a script's rank is in, for the stall watch and the verdict "
             "on who holds a hung job up (each call counted on entry and exit, nothing else)")
_NESTED = ("launch/nested.py: a script that starts its own distributed processes inside a job of several ranks is "
           "refused at once instead of hanging")
_AUDIT = "audit/: --audit's checks, which see the script's objects where it makes them"

# Every torch callable mgpu replaces at runtime (its public path), and who replaces it, why. Only these can be
# replaced (:func:`replace`). The wrappers call the original with the same arguments and return what it returns.
REPLACED: dict[str, str] = {
    **{f"torch.distributed.{name}": _OBSERVED for name in (
        "new_group", "barrier", "monitored_barrier", "all_reduce", "all_gather", "all_gather_into_tensor",
        "all_gather_object", "all_to_all", "all_to_all_single", "broadcast", "broadcast_object_list", "gather",
        "gather_object", "reduce", "reduce_scatter", "reduce_scatter_tensor", "scatter", "scatter_object_list",
        "send", "recv", "batch_isend_irecv")},
    "torch.distributed.init_process_group": (
        f"{_OBSERVED}; whether the rank joined a process group, for a script that never trained (also with "
        f"--stall-s 0). {_NESTED} (called in a child of the rank). {_AUDIT} (NCCL before set_device)"),
    "torch.multiprocessing.spawn": _NESTED,
    "torch.multiprocessing.start_processes": _NESTED,
    "torch.utils.data.DataLoader.__init__": f"{_AUDIT}: where each loader is made",
    "torch.utils.data.DataLoader.__iter__": f"{_AUDIT}: a loader that hands every rank the same samples; how long "
    "each rank waits for its batches (audit/pace.py)",
    **{f"torch.utils.data.distributed.DistributedSampler.{name}": f"{_AUDIT}: set_epoch never called, padded "
       "evaluation" for name in ("__init__", "__iter__", "set_epoch")},
    "torch.nn.parallel.DistributedDataParallel.__init__": f"{_AUDIT}: find_unused_parameters and unused parameters",
    "torch.optim.Optimizer.__init__": f"{_AUDIT}: parameters that differ across ranks",
    "torch.save": f"{_AUDIT}: every rank writing the same file",
    "torch.cuda.set_device": f"{_AUDIT}: NCCL initialised before torch.cuda.set_device",
    "torch.nn.Module.to": f"{_AUDIT}: a model on cuda:0 in a rank that is not local rank 0 (GPU ranks only)",
    "torch.nn.Module.cuda": f"{_AUDIT}: as Module.to",
    "torch.Tensor.to": f"{_AUDIT}: a batch on cuda:0 in a rank that is not local rank 0 (its first calls only)",
    "torch.Tensor.cuda": f"{_AUDIT}: as Tensor.to",
}


@dataclass
class Replacement:
    """A torch callable replaced by :func:`replace`: the original, and how to put it back."""

    path: str
    owner: Any
    name: str
    original: Callable
    owned: bool  # the owner held it itself (not inherited from a base class)

    def restore(self) -> None:
        if self.owned:
            setattr(self.owner, self.name, self.original)
        else:
            delattr(self.owner, self.name)  # the inherited one shows through again


def replace(path: str, wrap: Callable[[Callable], Callable]) -> Replacement | None:
    """Replace the torch callable at ``path`` (a key of :data:`REPLACED`) with ``wrap(original)``; None when this
    torch has no such callable (the caller goes on without it). torch must be imported."""
    if path not in REPLACED:
        raise KeyError(f"{path} is not in mgpucli.torch_parts.REPLACED: say there why it is replaced")
    owner_path, _, name = path.rpartition(".")
    owner = _resolve(owner_path)
    original = getattr(owner, name, None)
    if not callable(original):
        return None
    done = Replacement(path, owner, name, original, name in vars(owner))
    setattr(owner, name, wrap(original))
    return done


def _resolve(dotted: str) -> Any:
    """The module or class at ``dotted`` (``torch.utils.data.DataLoader``): the longest importable module, then
    attributes."""
    parts = dotted.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            found = importlib.import_module(".".join(parts[:cut]))
        except ImportError:
            continue
        for attr in parts[cut:]:
            found = getattr(found, attr)
        return found
    raise ImportError(dotted)


# ------------------------------------------------------------------ torchrun's argument handling (launch/runner.py)
def torchrun_options(options: Sequence[str]) -> Any:
    """``torch.distributed.run.parse_args``: the ``torchrun`` command's own parser on ``options`` (undocumented;
    the only way to read torchrun's options exactly as the command does, defaults and ``PET_*`` included)."""
    from torch.distributed import run

    return run.parse_args(list(options))


def torchrun_config(args: Any) -> tuple[Any, Any, list[str]]:
    """``torch.distributed.run.config_from_args``: (``LaunchConfig``, the worker's command, its arguments) from
    :func:`torchrun_options`' result, as the ``torchrun`` command builds them (undocumented; the config's fields
    are the documented ``LaunchConfig``)."""
    from torch.distributed import run

    return run.config_from_args(args)


# ------------------------------------------------------------------ autograd (audit/unused.py)
def at_backward_end(callback: Callable[[], None]) -> None:
    """Run ``callback`` once the current backward pass is over: ``Variable._execution_engine.queue_callback``
    (private; torch has no public hook for the end of backward, and DDP and FSDP use this one). Call it from
    inside a backward hook."""
    import torch

    torch.autograd.Variable._execution_engine.queue_callback(callback)


# ------------------------------------------------------------------ fused tensor-list ops (engine/ema.py)
def foreach_copy_(dst: list, src: list) -> None:
    """``torch._foreach_copy_``: every ``dst[i].copy_(src[i])`` in one fused device op (private; the public
    per-tensor ``copy_`` is one kernel launch per parameter)."""
    import torch

    torch._foreach_copy_(dst, src)


def foreach_lerp_(dst: list, src: list, weight: float) -> None:
    """``torch._foreach_lerp_``: every ``dst[i].lerp_(src[i], weight)`` in one fused device op (private; as
    :func:`foreach_copy_`). torch's own ``torch.optim.swa_utils`` averages the same way."""
    import torch

    torch._foreach_lerp_(dst, src, weight)


# ------------------------------------------------------------------ wrappers and sharded parameters
def is_compiled_wrapper(obj: Any) -> bool:
    """A ``torch.compile`` wrapper of a module (``OptimizedModule``, whose ``_orig_mod.`` segment
    ``torch.distributed.checkpoint`` leaves out of names). Its class lives in the private ``torch._dynamo``; never
    imported here (a compiled module exists only once it is)."""
    import sys

    cls = getattr(sys.modules.get("torch._dynamo.eval_frame"), "OptimizedModule", None)
    return cls is not None and isinstance(obj, cls)


def is_fsdp1_flat(p: Any) -> bool:
    """A parameter FSDP1 (``FullyShardedDataParallel``) flattened: its ``FlatParameter`` (a private class) or a
    view into one (its private ``_fsdp_flattened`` mark, under ``use_orig_params=True``). It holds only this rank's
    part; FSDP2's parameters are public ``DTensor``s."""
    return type(p).__name__ == "FlatParameter" or bool(getattr(p, "_fsdp_flattened", False))
