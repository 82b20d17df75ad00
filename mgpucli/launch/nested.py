"""A script that is its own launcher, run under ``mgpu launch`` with several workers: stopped at once, said why.

The ImageNet example's ``--multiprocessing-distributed`` (``torch.multiprocessing.spawn`` of one process per GPU,
each calling ``init_process_group``) inside N ranks of ``mgpu launch`` makes N x N processes fight over one
rendezvous, and the job hangs. Installed in a launched script worker when the script imports torch
(:mod:`mgpucli.torch_import`), this refuses, with :class:`NestedLaunchError` (its text:
:mod:`mgpucli.run_records.nested_launch`), in a job of more than one rank:

- ``torch.multiprocessing.spawn`` / ``start_processes`` called by the worker (the script's first line of it is in the
  traceback);
- ``torch.distributed.init_process_group`` called in a child process of the worker (a forked
  ``multiprocessing.Process``): the child fails and the worker is stopped (SIGTERM), so the job ends promptly.

DataLoader workers and other helper processes (which never call ``init_process_group``) are not affected, nor is a
job of one rank (``--nproc 1``), where the script may spawn its own: there, :func:`own_rendezvous` gives what it
starts a rendezvous of its own.
"""

from __future__ import annotations

import contextlib
import functools
import os
import signal
import sys
from collections.abc import Callable, MutableMapping

from mgpucli import env_vars
from mgpucli.run_records.nested_launch import ERROR_NAME, message


class NestedLaunchError(RuntimeError):
    """The script starts distributed processes of its own in a rank of a launched job (its name: ``ERROR_NAME``)."""


def own_rendezvous(world_size: int, environ: MutableMapping[str, str] | None = None) -> None:
    """A job of one rank (``--nproc 1``), where the script may be its own launcher: what it starts (the processes of
    ``torch.multiprocessing.spawn``, a ``multiprocessing.Process``, a ``torchrun`` of its own) inherits this worker's
    environment, where torch's agent put ``TORCHELASTIC_USE_AGENT_STORE=True``: every rendezvous under that flag only
    connects, as a client, to a store the agent hosts, so the script's processes wait for a store none of them starts
    (plain torchrun hangs the same way). The worker takes the flag out and gives ``MASTER_PORT`` a free port: the
    script's rank 0 (the worker itself, or the first process it starts) hosts its own store there, as under plain
    ``python``. Nothing of mgpu's needs the agent's store in a job of one rank."""
    env = os.environ if environ is None else environ
    if world_size != 1 or env.get(env_vars.USE_AGENT_STORE) != str(True):
        return
    from mgpucli.launch.ports import free_port

    del env[env_vars.USE_AGENT_STORE]
    env["MASTER_PORT"] = str(free_port())


def install(rank: int, world_size: int) -> None:
    """Guard this worker's torch (imported) when the job has more than one rank."""
    if world_size <= 1:
        return
    import torch.distributed as dist

    from mgpucli.torch_parts import replace

    worker = os.getpid()
    for name in ("spawn", "start_processes"):
        what = f"torch.multiprocessing.{name}"
        replace(what, functools.partial(_refuse, what, rank=rank, world_size=world_size))
    if dist.is_available():
        replace("torch.distributed.init_process_group",
                functools.partial(_in_children, worker=worker, rank=rank, world_size=world_size))


def _refuse(what: str, original: Callable, rank: int, world_size: int) -> Callable:
    @functools.wraps(original)
    def refused(*args, **kwargs):
        raise NestedLaunchError(message(rank, world_size, what))

    return refused


def _in_children(original: Callable, worker: int, rank: int, world_size: int) -> Callable:
    @functools.wraps(original)
    def init_process_group(*args, **kwargs):
        if os.getpid() != worker:
            error = NestedLaunchError(message(rank, world_size, "a child process of the rank calls "
                                              "init_process_group"))
            print(f"{ERROR_NAME}: {error}", file=sys.stderr, flush=True)  # in the rank's log before it is stopped
            with contextlib.suppress(OSError):
                os.kill(worker, signal.SIGTERM)  # the worker would wait for this child, or go on without it
            raise error
        return original(*args, **kwargs)

    return init_process_group
