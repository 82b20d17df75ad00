"""Process-group lifetime, device and backend choice (the collectives mgpu uses: :mod:`.collectives`).

The one place that turns a RankEnv into a device and an initialised process group.
"""

from __future__ import annotations

import contextlib
import os
import sys
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, NoReturn

import torch
import torch.distributed as dist

from mgpucli import env_vars
from mgpucli.cpus import omp_threads_problem, threads_per_process
from mgpucli.distributed.env import RankEnv
from mgpucli.distributed.store_client import connect_job_store
from mgpucli.errors import UsageError


@dataclass
class Runtime:
    """This process's place in the job, once the process group exists."""

    env: RankEnv
    device: torch.device
    backend: str | None  # None for a single process without a process group
    cpu_threads: int | None = None

    @property
    def rank(self) -> int:
        return self.env.rank

    @property
    def world_size(self) -> int:
        return self.env.world_size

    @property
    def is_main(self) -> bool:
        return self.env.rank == 0

    @property
    def distributed(self) -> bool:
        return self.backend is not None


def choose_device(preference: str, env: RankEnv, cuda_count: int | None = None) -> torch.device:
    """cuda:LOCAL_RANK when CUDA is there (or asked for), CPU otherwise."""
    count = torch.cuda.device_count() if cuda_count is None else cuda_count
    if preference == "cpu" or (preference == "auto" and count == 0):
        return torch.device("cpu")
    if count == 0:
        raise UsageError(
            "trainer.device=cuda, but no CUDA GPU is visible.",
            "Use trainer.device=cpu (or auto), or run on a machine with a GPU.",
        )
    if env.local_rank >= count:
        raise UsageError(
            f"LOCAL_RANK={env.local_rank}, but only {count} GPU(s) are visible to this process.",
            "Start one process per GPU (mgpu launch --gpus N), or run on CPUs with trainer.device=cpu.",
        )
    return torch.device("cuda", env.local_rank)


def default_cpu_threads(env: RankEnv) -> int:
    """Cores / processes on this node, at least 1 (torchrun alone would pin every worker to one thread)."""
    return threads_per_process(env.local_world_size)


def setup_process_group(env: RankEnv, device_pref: str, timeout_s: int, cpu_threads: int | None) -> Runtime:
    """Pick the device, set the thread count on CPU, and initialise the process group when distributed."""
    device = choose_device(device_pref, env)
    problem = omp_threads_problem(os.environ)
    if problem:
        raise UsageError(f"{problem}.", "Unset it (`unset OMP_NUM_THREADS`), or give a count: "
                         "export OMP_NUM_THREADS=4 (mgpu sets cores / processes for CPU workers by itself).")
    threads = None
    if device.type == "cpu":
        threads = cpu_threads or default_cpu_threads(env)
        torch.set_num_threads(threads)
    else:
        torch.cuda.set_device(device)
    backend = None
    if env.distributed:
        _require_rendezvous(env)
        backend = "nccl" if device.type == "cuda" else "gloo"
        kwargs: dict[str, Any] = {"backend": backend, "timeout": timedelta(seconds=timeout_s)}
        if device.type == "cuda":
            kwargs["device_id"] = device
        store = _attempt_store(env, timeout_s)
        if store is not None:
            kwargs.update(store=store, rank=env.rank, world_size=env.world_size)
        dist.init_process_group(**kwargs)
    return Runtime(env=env, device=device, backend=backend, cpu_threads=threads)


def _require_rendezvous(env: RankEnv) -> None:
    """RANK and WORLD_SIZE without MASTER_ADDR/MASTER_PORT (a shell that kept a job's variables): torch's env://
    rendezvous would fail with a ValueError traceback, or a bad port deep in its TCP store."""
    missing = [key for key in ("MASTER_ADDR", "MASTER_PORT") if not os.environ.get(key, "").strip()]
    port = os.environ.get("MASTER_PORT", "").strip()
    if missing:
        problem = f"{' and '.join(missing)} {'is' if len(missing) == 1 else 'are'} not set"
    elif not (port.isdigit() and 0 < int(port) < 65536):
        problem = f"MASTER_PORT={port!r} is not a port number (1-65535)"
    else:
        return
    raise UsageError(
        f"RANK={env.rank} and WORLD_SIZE={env.world_size} make this process one rank of a job, but {problem}: "
        "there is no rendezvous to join.",
        "Unset the stale variables (`unset RANK WORLD_SIZE LOCAL_RANK`) to train in this one process, or start "
        "the workers with `mgpu launch` (or torchrun), which sets them all.",
    )


def _attempt_store(env: RankEnv, timeout_s: int):
    """Under torchrun's agent store, a key space of this restart attempt's own.

    torch 2.13: a restarted worker group can read the previous attempt's gloo addresses from the shared
    store and fail to connect (pytorch#135712), intermittently with a static rendezvous (--master-port).
    Prefixing the keys with the attempt number keeps each attempt's rendezvous apart.
    """
    if os.environ.get(env_vars.USE_AGENT_STORE) != "True":
        return None
    attempt = os.environ.get(env_vars.RESTART_COUNT, "0")
    return connect_job_store(timeout_s, prefix=f"mgpu/attempt_{attempt}")


_BACKGROUND: list[Any] = []


def background_group() -> Any:
    """A gloo group of every rank for collectives made by another thread than the training's (the background
    checkpoint writes of ``trainer.async_save``): never interleaved with the training's on one group. Made at its
    first use, a collective call every rank makes; None without a process group. :func:`teardown` destroys it."""
    if not (dist.is_available() and dist.is_initialized()):
        return None
    if not _BACKGROUND:
        _BACKGROUND.append(dist.new_group(backend="gloo"))
    return _BACKGROUND[0]


def teardown() -> None:
    """Destroy the process group if one exists (success or failure), and every group made beside it."""
    _BACKGROUND.clear()
    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()


def exit_after_teardown(code: int = 0) -> NoReturn:
    """End a worker whose process group is torn down and whose output is written: flush, then leave without the
    interpreter's shutdown. In that shutdown torch 2.13 can abort a gloo process whose group objects are destroyed
    late ("terminate called without an active exception", SIGABRT: a finished job reported as failed). Only for
    mgpu's own workers, whose files are closed explicitly; a user's script gets the interpreter's normal exit."""
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    os._exit(code)
