"""Device mistakes on GPUs: a model or batch on ``cuda:0`` in a rank whose local rank is not 0, and NCCL initialised
before ``torch.cuda.set_device(local_rank)`` (the tutorial's set_device step).

Installed only where the workers can see GPUs (``mgpu launch --cpu`` hides them) and, for placements, only in ranks
whose local rank is not 0 (local rank 0 on ``cuda:0`` is right). Nothing here touches CUDA itself: the checks read
devices the script has already used, and ``torch.cuda.set_device`` is recorded as the script calls it.

- ``torch.distributed.init_process_group`` with nccl (or no backend, where CUDA is available) and no ``device_id``:
  the current device must be this rank's own.
- ``nn.Module.to``/``.cuda``: the model's parameters after the move; ``Tensor.to``/``.cuda``: the result, for the
  first :data:`TENSOR_WINDOW` calls only (batches move every step: after the window the original methods are back).
"""

from __future__ import annotations

import functools
import itertools
import os
import threading

import torch

from mgpucli.audit.session import Session
from mgpucli.audit.where import user_where
from mgpucli.torch_parts import replace

TENSOR_WINDOW = 2000  # Tensor.to/.cuda calls checked, then unpatched

SET_DEVICE_FIX = ("torch.cuda.set_device(local_rank)  # first: before init_process_group and any .cuda()\n"
                  "device = torch.device(\"cuda\", local_rank)\n"
                  "model = model.to(device)\n"
                  "x, y = x.to(device), y.to(device)")


def on_someone_elses_gpu(index: int | None, local_rank: int, local_world_size: int, device_count: int) -> bool:
    """A tensor on ``cuda:index`` in local rank ``local_rank`` is on GPU 0 although this rank has a GPU of its own (it
    sees at least ``local_rank + 1`` GPUs, so it is not one GPU per process through CUDA_VISIBLE_DEVICES)."""
    return index == 0 and local_rank != 0 and local_world_size > 1 and device_count > local_rank


def nccl_backend(backend: object, cuda_available: bool) -> bool:
    """``init_process_group(backend)`` sets up NCCL: named (``nccl``, ``cuda:nccl``), or the default where CUDA is."""
    name = str(backend or "").lower()
    return "nccl" in name if name else cuda_available


class Devices:
    def __init__(self, session: Session):
        self.s = session
        self.device_set: int | None = None
        self._calls = 0
        self._inside_module = threading.local()
        self._restore: list = []

    def install(self) -> None:
        if os.environ.get("CUDA_VISIBLE_DEVICES") == "":
            return  # no GPU visible to the workers (--cpu)
        self._wrap_set_device()
        self._wrap_init()
        if self.s.local_rank != 0 and self.s.local_world_size > 1:
            self._wrap_module_moves()
            self._wrap_tensor_moves()

    # ------------------------------------------------------------------------------------------ set_device, init
    def _wrap_set_device(self) -> None:
        checks = self

        def recorded(original):
            @functools.wraps(original)
            def set_device(device):
                original(device)
                try:
                    checks.device_set = torch.cuda.current_device()
                except Exception:  # noqa: BLE001
                    pass

            return set_device

        replace("torch.cuda.set_device", recorded)

    def _wrap_init(self) -> None:
        checks = self

        def checked(original):
            @functools.wraps(original)
            def init_process_group(backend=None, *args, **kwargs):
                try:
                    checks.before_init(backend, kwargs)
                except Exception as err:  # noqa: BLE001
                    checks.s.note(f"init_process_group not checked ({type(err).__name__}: {err})")
                return original(backend, *args, **kwargs)

            return init_process_group

        replace("torch.distributed.init_process_group", checked)

    def current_device(self) -> int:
        """The device NCCL would bind to now, without initialising CUDA (uninitialised: device 0)."""
        if self.device_set is not None:
            return self.device_set
        return torch.cuda.current_device() if torch.cuda.is_initialized() else 0

    def before_init(self, backend: object, kwargs: dict) -> None:
        r = self.s.local_rank
        if kwargs.get("device_id") is not None or r == 0 or self.s.local_world_size <= 1:
            return
        if not nccl_backend(backend, torch.cuda.is_available()) or torch.cuda.device_count() <= r:
            return
        current = self.current_device()
        if current == r:
            return
        self.s.report(
            "no_set_device",
            f"init_process_group(\"nccl\") in local rank {r} before torch.cuda.set_device({r}): its current device "
            f"is cuda:{current}",
            "NCCL binds each rank's communicator to its current device: ranks that share cuda:0 hang or fail "
            "(\"Duplicate GPU detected\"), and every .cuda() or \"cuda\" without an index lands on GPU 0 as well.",
            "torch.cuda.set_device(local_rank)  # before init_process_group\n"
            "dist.init_process_group(\"nccl\")\n"
            "# or: dist.init_process_group(\"nccl\", device_id=torch.device(\"cuda\", local_rank))",
            user_where(), {"local_rank": r, "current_device": current})

    # ------------------------------------------------------------------------------------------ placements
    def _wrap_module_moves(self) -> None:
        checks = self

        def placed(original):
            @functools.wraps(original)
            def move(module, *args, **kwargs):
                checks._inside_module.active = True
                try:
                    out = original(module, *args, **kwargs)
                finally:
                    checks._inside_module.active = False
                checks.placed_module(module)
                return out

            return move

        for name in ("to", "cuda"):
            replace(f"torch.nn.Module.{name}", placed)

    def _wrap_tensor_moves(self) -> None:
        checks = self

        def placed(original):
            @functools.wraps(original)
            def move(tensor, *args, **kwargs):
                out = original(tensor, *args, **kwargs)
                checks.placed_tensor(out)
                return out

            return move

        for name in ("to", "cuda"):
            done = replace(f"torch.Tensor.{name}", placed)
            if done is not None:
                self._restore.append(done)

    def _unwrap_tensor_moves(self) -> None:
        for done in self._restore:
            done.restore()
        self._restore.clear()

    def _device_count(self) -> int:
        return torch.cuda.device_count()

    def placed_module(self, module: torch.nn.Module) -> None:
        first = next(itertools.chain(module.parameters(), module.buffers()), None)
        if first is None or not first.is_cuda:
            return
        if on_someone_elses_gpu(first.get_device(), self.s.local_rank, self.s.local_world_size, self._device_count()):
            self._report_placement(f"the model ({type(module).__name__})")

    def placed_tensor(self, out: object) -> None:
        self._calls += 1
        if self._calls >= TENSOR_WINDOW and self._restore:
            self._unwrap_tensor_moves()
        if getattr(self._inside_module, "active", False) or not isinstance(out, torch.Tensor) or not out.is_cuda:
            return
        if on_someone_elses_gpu(out.get_device(), self.s.local_rank, self.s.local_world_size, self._device_count()):
            self._report_placement("a tensor (a batch?)")

    def _report_placement(self, what: str) -> None:
        r = self.s.local_rank
        self.s.report(
            "device_cuda0",
            f"{what} on cuda:0 in local rank {r}, which has GPU {r} of its own",
            f"GPU 0 holds this rank's memory and does its work on top of rank 0's: it runs out of memory or becomes "
            f"the bottleneck while GPU {r} idles; DDP with device_ids=[local_rank] fails on a model elsewhere.",
            SET_DEVICE_FIX, user_where(), {"local_rank": r, "what": what})
