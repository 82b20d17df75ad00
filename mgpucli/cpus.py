"""How many CPU cores this process may use (stdlib only: the launcher and `mgpu --help` paths never import torch).

The affinity mask, not the machine's count: ``taskset``, a cgroup cpuset (``docker --cpuset-cpus``) or a
Slurm allocation narrow it, and per-worker thread counts must be shared out of what is usable.
"""

from __future__ import annotations

import os


def available_cores() -> int:
    """Cores this process may run on (respects taskset/cgroup affinity); at least 1."""
    try:
        return len(os.sched_getaffinity(0)) or 1
    except AttributeError:  # macOS, Windows: no affinity API
        return os.cpu_count() or 1


def threads_per_process(nproc: int) -> int:
    """The usable cores shared out between ``nproc`` processes on this machine: at least 1 each."""
    return max(1, available_cores() // max(1, nproc))


def omp_threads_problem(environ) -> str | None:
    """Why ``OMP_NUM_THREADS`` in ``environ`` can't be used (torch would silently ignore it), or None."""
    raw = environ.get("OMP_NUM_THREADS")
    if raw is None or raw.strip() == "":
        return None
    if raw.strip().isdigit() and int(raw) >= 1:
        return None
    return f"OMP_NUM_THREADS={raw!r} is not a positive integer, and torch would ignore it without a word"
