"""Which engine describes this job's nodes, read in one place (pure, stdlib only: the environment is passed in).

``mgpu launch`` takes the node layout from its own options first, field by field, as torchrun does; what they
leave out comes from the one engine that describes the job, read here into a :class:`SchedulerJob`. The engines,
in the order they are tried (the first whose variables are set wins; the others are not read):

1. **SLURM**: ``SLURM_JOB_ID`` and the node list (:mod:`mgpucli.launch.slurm`).
2. **torchrun's PET_* variables**: what ``torchrun`` itself reads as the default of ``--<option>``
   (``PET_NNODES``, ``PET_NODE_RANK``, ``PET_NPROC_PER_NODE``, ``PET_MASTER_ADDR``, ``PET_MASTER_PORT``, and for
   a c10d rendezvous ``PET_RDZV_ENDPOINT``/``PET_RDZV_BACKEND``/``PET_RDZV_ID``). Kubeflow's PyTorchJob and
   TrainJob, TorchX and most managed services set them in every pod.
3. **The pod's variables**: ``MASTER_ADDR``, ``MASTER_PORT``, ``WORLD_SIZE`` and ``RANK``, which a PyTorchJob
   operator without ``PET_*`` sets per pod (one pod per node: ``WORLD_SIZE`` counts pods, ``RANK`` is this
   pod's). The same names are what every torchrun worker gets and what a shell often keeps from an earlier job,
   so they count only inside a Kubernetes pod (``KUBERNETES_SERVICE_HOST``), with ``WORLD_SIZE`` above 1.

Inside a worker of a running launcher (``LOCAL_RANK`` or ``TORCHELASTIC_RUN_ID`` set) neither torchrun's nor the
pod's variables describe a job to launch: they describe the worker, and are not read.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass

from mgpucli.env_vars import LOCAL_RANK, PET_PREFIX, RANK, RUN_ID, WORLD_SIZE
from mgpucli.errors import UsageError
from mgpucli.launch.node_range import NodeRange, parse_nnodes
from mgpucli.launch.slurm import read_slurm

# Torch's defaults plus SIGUSR1, SLURM's early-warning signal (sbatch --signal=USR1@60): forwarded to the
# workers instead of killing the launcher outright.
SLURM_SIGNALS = "SIGTERM,SIGINT,SIGHUP,SIGQUIT,SIGUSR1"
TORCHRUN_DEFAULT_PORT = 29500  # torchrun's --master-port default, also for a pod without MASTER_PORT
# The variables read, each with the SchedulerJob field it fills (messages name the variable behind a value).
PET_READ = {"PET_NNODES": "nnodes", "PET_NODE_RANK": "node_rank", "PET_NPROC_PER_NODE": "nproc_per_node",
            "PET_MASTER_ADDR": "master_addr", "PET_MASTER_PORT": "master_port", "PET_RDZV_ENDPOINT": "rdzv_endpoint",
            "PET_RDZV_BACKEND": "rdzv_backend", "PET_RDZV_ID": "rdzv_id"}
# A pod's WORLD_SIZE and RANK (a PyTorchJob's operator sets them) are the node count and the node's rank.
POD_VARS = {"MASTER_ADDR": "master_addr", "MASTER_PORT": "master_port", WORLD_SIZE: "nnodes",
            RANK: "node_rank"}
SLURM_NAME, PET_NAME, POD_NAME = "SLURM", "torchrun's PET_* variables", "the pod's variables"
IN_A_POD = "KUBERNETES_SERVICE_HOST"  # set by Kubernetes in every container of every pod
WORKER_MARKS = (LOCAL_RANK, RUN_ID)  # torch's agent sets them for each worker it starts


@dataclass(frozen=True)
class SchedulerJob:
    """What an engine says about the job's nodes: every node reads the same answers without talking to the
    others. ``variables``: the ones read, each as (the field it fills, ``NAME=value``)."""

    name: str  # SLURM_NAME, PET_NAME or POD_NAME: named in messages and notes
    job_id: str
    nnodes: int
    node_rank: int | None  # None: the engine does not say which node this is
    master_addr: str | None  # None: the engine names no host
    master_port: int
    rdzv_id: str | None  # None: derived from the job and the rendezvous, alike on every node
    signals: str | None = None  # torch's --signals-to-handle under this engine (None: torch's default)
    nproc_per_node: str | None = None  # as given (a count, or torchrun's "auto"/"gpu"); None: not said
    rdzv_endpoint: str | None = None  # a c10d rendezvous's HOST:PORT (None: static, at master_addr)
    nnodes_min: int | None = None  # an elastic range's MIN (PET_NNODES=MIN:MAX; nnodes is its MAX); None: fixed
    variables: tuple[tuple[str, str], ...] = ()

    def said(self, field: str) -> str:
        """Where ``field``'s value came from, for messages: ``NAME=value``, else the engine's name and the value."""
        words = {"nnodes": "node count", "node_rank": "node rank", "master_addr": "master address",
                 "master_port": "master port", "nproc_per_node": "processes per node"}.get(field, field)
        return next((text for name, text in self.variables if name == field),
                    f"{self.name}'s {words} {getattr(self, field, '')}".rstrip())

    def describe(self) -> str:
        """One line: the engine and the variables it was read from."""
        job = f" job {self.job_id}" if self.job_id else ""
        read = " ".join(text for _, text in self.variables)
        return f"{self.name}{job} ({read})" if read else f"{self.name}{job}"


def from_slurm(environ: Mapping[str, str]) -> SchedulerJob | None:
    """The SLURM allocation this process runs in (:func:`mgpucli.launch.slurm.read_slurm`), or None outside one."""
    info = read_slurm(environ)
    if info is None:
        return None
    node_rank = 0 if info.nnodes == 1 else info.node_rank  # a step of one node: whichever node it runs on
    return SchedulerJob(name=SLURM_NAME, job_id=info.job_id, nnodes=info.nnodes, node_rank=node_rank,
                        master_addr=info.master_addr if info.hosts else None, master_port=info.master_port,
                        rdzv_id=info.rdzv_id, signals=SLURM_SIGNALS)


def _is_worker(environ: Mapping[str, str]) -> bool:
    return any(environ.get(name) for name in WORKER_MARKS)


def _int(environ: Mapping[str, str], name: str) -> int | None:
    """``name`` as a whole number, None when unset; UsageError naming it when it is no number."""
    raw = environ.get(name, "").strip()
    if not raw:
        return None
    try:
        return int(raw)
    except ValueError:
        raise UsageError(f"{name}={raw!r} is not a whole number.",
                         f"Fix or unset {name}, or give the option it stands for on the command line.") from None


def _port(environ: Mapping[str, str], name: str) -> int:
    found = _int(environ, name)
    return TORCHRUN_DEFAULT_PORT if found is None else found


def _node_range(environ: Mapping[str, str]) -> NodeRange:
    """``PET_NNODES``: a count (default 1), or torchrun's ``MIN:MAX`` (an elastic job when MIN < MAX)."""
    raw = environ.get("PET_NNODES", "").strip()
    return parse_nnodes(raw, "PET_NNODES=") if raw else NodeRange(1, 1)


def from_torchrun(environ: Mapping[str, str]) -> SchedulerJob | None:
    """torchrun's ``PET_*`` variables (what ``torchrun`` would take as its options), or None when none is set."""
    read = [name for name in PET_READ if environ.get(name, "").strip()]
    if not read or _is_worker(environ):
        return None
    backend = environ.get("PET_RDZV_BACKEND", "").strip()
    if backend not in ("", "static", "c10d"):
        raise UsageError(f"PET_RDZV_BACKEND={backend}: mgpu's nodes meet through a static or a c10d rendezvous.",
                         "Set PET_RDZV_BACKEND=c10d (or unset it), or pass --rdzv-endpoint HOST:PORT yourself.")
    endpoint = environ.get("PET_RDZV_ENDPOINT", "").strip() or None
    nodes = _node_range(environ)
    if backend == "static":
        endpoint = None  # torchrun's static rendezvous is at --master-addr:--master-port
    return SchedulerJob(
        name=PET_NAME, job_id=environ.get("PET_RDZV_ID", "").strip(),
        nnodes=nodes.high, nnodes_min=nodes.low if nodes.elastic else None, node_rank=_int(environ, "PET_NODE_RANK"),
        master_addr=environ.get("PET_MASTER_ADDR", "").strip() or None,
        master_port=_port(environ, "PET_MASTER_PORT"),
        rdzv_id=environ.get("PET_RDZV_ID", "").strip() or None,
        nproc_per_node=environ.get("PET_NPROC_PER_NODE", "").strip() or None, rdzv_endpoint=endpoint,
        variables=tuple((PET_READ[name], f"{name}={environ[name].strip()}") for name in read),
    )


def from_pod(environ: Mapping[str, str]) -> SchedulerJob | None:
    """A Kubernetes pod's ``MASTER_ADDR``/``MASTER_PORT``/``WORLD_SIZE``/``RANK`` (one pod per node), or None when
    this is no pod of a job of several (see the module docstring for why the rule is that strict)."""
    if not environ.get(IN_A_POD) or _is_worker(environ) or not environ.get("MASTER_ADDR", "").strip():
        return None
    pods = _int(environ, WORLD_SIZE)
    if pods is None or pods < 2 or not environ.get(RANK, "").strip():
        return None
    read = [name for name in POD_VARS if environ.get(name, "").strip()]
    return SchedulerJob(
        name=POD_NAME, job_id="", nnodes=pods, node_rank=_int(environ, RANK),
        master_addr=environ["MASTER_ADDR"].strip(), master_port=_port(environ, "MASTER_PORT"), rdzv_id=None,
        variables=tuple((POD_VARS[name], f"{name}={environ[name].strip()}") for name in read),
    )


READERS: tuple[Callable[[Mapping[str, str]], SchedulerJob | None], ...] = (from_slurm, from_torchrun, from_pod)


def read_scheduler(environ: Mapping[str, str]) -> SchedulerJob | None:
    """The first engine whose variables are set (:data:`READERS`, in order), or None (the options alone describe
    the job). UsageError for a variable that cannot be read (a count that is not a number, say)."""
    for reader in READERS:
        found = reader(environ)
        if found is not None:
            return found
    return None


def unread_torchrun_variables(environ: Mapping[str, str]) -> list[str]:
    """``PET_*`` variables set here that mgpu does not read (``PET_MAX_RESTARTS``, say): torchrun would take them
    as its options' defaults; mgpu's launcher does not, and says so instead of ignoring them silently."""
    return sorted(f"{k}={v}" for k, v in environ.items() if k.startswith(PET_PREFIX) and k not in PET_READ)
