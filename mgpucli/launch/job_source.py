"""Which engine describes this job's nodes, read in one place (pure: the environment is passed in).

``mgpu launch`` takes the node layout from its own options first; what they leave out comes from the scheduler
the launcher runs under, read here from its environment variables into one :class:`SchedulerJob`. SLURM is the
one reader today (:mod:`mgpucli.launch.slurm`); another scheduler (a Kubernetes job's ``PET_*`` variables, say)
joins by adding its reader to :data:`READERS`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass

from mgpucli.launch.slurm import read_slurm

# Torch's defaults plus SIGUSR1, SLURM's early-warning signal (sbatch --signal=USR1@60): forwarded to the
# workers instead of killing the launcher outright.
SLURM_SIGNALS = "SIGTERM,SIGINT,SIGHUP,SIGQUIT,SIGUSR1"


@dataclass(frozen=True)
class SchedulerJob:
    """What a scheduler says about the job's nodes: every node reads the same answers without talking to the
    others."""

    name: str  # "SLURM": named in messages and notes
    job_id: str
    nnodes: int
    node_rank: int | None  # None: the scheduler does not say which node this is
    master_addr: str | None  # None: the scheduler names no host
    master_port: int
    rdzv_id: str
    signals: str | None = None  # torch's --signals-to-handle under this scheduler (None: torch's default)


def from_slurm(environ: Mapping[str, str]) -> SchedulerJob | None:
    """The SLURM allocation this process runs in (:func:`mgpucli.launch.slurm.read_slurm`), or None outside one."""
    info = read_slurm(environ)
    if info is None:
        return None
    return SchedulerJob(name="SLURM", job_id=info.job_id, nnodes=info.nnodes, node_rank=info.node_rank,
                        master_addr=info.master_addr if info.hosts else None, master_port=info.master_port,
                        rdzv_id=info.rdzv_id, signals=SLURM_SIGNALS)


READERS: tuple[Callable[[Mapping[str, str]], SchedulerJob | None], ...] = (from_slurm,)


def read_scheduler(environ: Mapping[str, str]) -> SchedulerJob | None:
    """The first scheduler whose variables are set, or None (the options alone describe the job)."""
    for reader in READERS:
        found = reader(environ)
        if found is not None:
            return found
    return None
