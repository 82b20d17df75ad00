"""Rank setup: the job this machine is a node of, launcher variables left in the shell, their consistency, and
the rendezvous port.

The doctor runs from a user's shell, never under a launcher, so any of these variables is a leftover: plain
``mgpu train`` (or ``python train.py``) would believe it is one rank of a job and wait for peers that never
come. torchrun and ``mgpu launch`` overwrite them for their workers, so they only bite outside a launcher. The
exception is a pod of a Kubernetes job, whose operator sets ``MASTER_*``/``WORLD_SIZE``/``RANK`` for the pod: the
engine that describes the job (:mod:`mgpucli.launch.job_source`, the reader ``mgpu launch`` uses) says so.
"""

from __future__ import annotations

from mgpucli import env_vars
from mgpucli.distributed.env import read_rank_env
from mgpucli.doctor.host import TORCHRUN_DEFAULT_PORT
from mgpucli.doctor.observation import Observation
from mgpucli.doctor.result import CheckResult, fail, ok, warn
from mgpucli.errors import UsageError
from mgpucli.launch.job_source import PET_NAME, POD_NAME, POD_VARS, SchedulerJob, read_scheduler

AREA = "rank setup"
RANK_VARS = (*env_vars.ROLE, "MASTER_ADDR", "MASTER_PORT")
HOLDER_HINT = "see who holds it: `ss -ltnp 'sport = :{port}'`"


def _unset(names: list[str]) -> str:
    return "unset " + " ".join(names)


def _inconsistency(obs: Observation) -> str:
    """'' when the rank variables could describe a real job, else what is wrong with them."""
    try:
        env = read_rank_env(obs.env)
    except UsageError as err:
        return err.message
    if env.local_world_size > env.world_size:
        return f"LOCAL_WORLD_SIZE={env.local_world_size} exceeds WORLD_SIZE={env.world_size}."
    local_given = env_vars.LOCAL_RANK in obs.env
    if local_given and env_vars.LOCAL_WORLD_SIZE in obs.env and env.local_rank >= env.local_world_size:
        return f"LOCAL_RANK={env.local_rank} does not fit LOCAL_WORLD_SIZE={env.local_world_size}."
    gpus = obs.torch.device_count
    if local_given and gpus and env.local_rank >= gpus:
        return f"LOCAL_RANK={env.local_rank}, but only {gpus} GPU(s) are visible: cuda:{env.local_rank} does not exist."
    return ""


def _job(obs: Observation) -> SchedulerJob | None:
    try:
        return read_scheduler(obs.env)
    except UsageError:
        return None  # the 'job' check reports it


def check_job(obs: Observation) -> CheckResult:
    """The engine that describes the job (SLURM, torchrun's PET_*, a pod's variables) and the shape of the job
    ``mgpu launch`` would start from here with the same options."""
    name = "job"
    try:
        job = read_scheduler(obs.env)
    except UsageError as err:
        return fail(name, AREA, err.message, err.hint or "")
    if job is None:
        return ok(name, AREA, "one node: no SLURM, torchrun PET_* or Kubernetes pod variables (mgpu launch --nnodes "
                              "N for several)")
    count = job.nproc_per_node if job.nproc_per_node and job.nproc_per_node.isdigit() else None
    nproc = int(count) if count else obs.plan.nproc
    where = (f"this is node {job.node_rank}" if job.node_rank is not None else
             "the c10d rendezvous assigns this node's rank" if job.rdzv_endpoint else "this node's rank is not said")
    meet = job.rdzv_endpoint or (f"{job.master_addr}:{job.master_port}" if job.master_addr else "not said")
    nodes = f"{job.nnodes} node(s)" if job.nnodes_min is None else \
        f"an elastic job of {job.nnodes_min} to {job.nnodes} node(s)"
    shape = (f"{job.describe()}: mgpu launch would start {nodes} x {nproc} process(es) = world size "
             f"{'up to ' if job.nnodes_min is not None else ''}{job.nnodes * nproc}; {where}; the nodes meet at {meet}")
    if job.nnodes_min is not None and not job.rdzv_endpoint:
        return fail(name, AREA, f"{shape}. An elastic job needs a c10d rendezvous: a static one cannot take a lost "
                    "node back", "Set PET_RDZV_BACKEND=c10d and PET_RDZV_ENDPOINT=HOST:PORT (a host that stays), or "
                    "give mgpu launch --rdzv-endpoint HOST:PORT.")
    if job.node_rank is not None and not 0 <= job.node_rank < job.nnodes:
        return fail(name, AREA, f"{shape}. {job.said('node_rank')} is not below {job.said('nnodes')}",
                    "Fix the job's variables, or give mgpu launch --node-rank and --nnodes.")
    if count and obs.plan.kind == "cuda" and int(count) > obs.torch.device_count:
        return warn(name, AREA, f"{shape}; but torch sees {obs.torch.device_count} GPU(s) here",
                    f"Give the pod {count} GPUs, or set {job.said('nproc_per_node').split('=')[0]} to the GPU count.")
    return ok(name, AREA, shape)


def check_rank_variables(obs: Observation) -> CheckResult:
    name = "rank variables"
    present = [v for v in RANK_VARS if v in obs.env]
    if not present:
        return ok(name, AREA, "none set (launchers set them per worker)")
    shown = " ".join(f"{v}={obs.env[v]}" for v in present)
    job = _job(obs)
    if job is not None and job.name in (PET_NAME, POD_NAME) and set(present) <= set(POD_VARS):
        return ok(name, AREA, f"{shown}: set for this pod by the job's operator; mgpu launch reads {job.name}, and "
                              "torch's agent gives each worker its own")
    problem = _inconsistency(obs)
    if problem:
        return fail(name, AREA, f"left in this shell: {shown}. {problem}", _unset(present))
    return warn(
        name,
        AREA,
        f"left in this shell: {shown}; a script run without a launcher would join that job and wait for its peers",
        _unset(present),
    )


def check_master_port(obs: Observation) -> CheckResult:
    """A taken rendezvous port fails a job; with torchrun's c10d backend it can even join the other job."""
    name = "MASTER_PORT"
    raw = obs.env.get("MASTER_PORT")
    ports = obs.host.ports_in_use
    if raw is None:
        why = ports.get(TORCHRUN_DEFAULT_PORT)
        if why:
            return warn(
                name,
                AREA,
                f"unset; torchrun's default port {TORCHRUN_DEFAULT_PORT} is {why}: a plain `torchrun` without "
                "--standalone/--master-port would fail or join another job",
                f"Use `mgpu launch` (picks a free port) or torchrun --standalone; {HOLDER_HINT.format(port=29500)}",
            )
        return ok(name, AREA, f"unset; torchrun's default port {TORCHRUN_DEFAULT_PORT} is free")
    if not raw.strip().isdigit() or not 0 < int(raw) < 65536:
        return fail(name, AREA, f"MASTER_PORT={raw!r} is not a port number (1-65535)", "unset MASTER_PORT")
    port = int(raw)
    why = ports.get(port)
    if why is None:
        return ok(name, AREA, f"MASTER_PORT={port} (not probed)")
    if why:
        return fail(
            name,
            AREA,
            f"MASTER_PORT={port} is {why}: a job rendezvousing there fails or joins whatever holds it",
            f"unset MASTER_PORT (mgpu launch picks a free port), or {HOLDER_HINT.format(port=port)}",
        )
    return ok(name, AREA, f"MASTER_PORT={port} is free")


CHECKS = (check_job, check_rank_variables, check_master_port)
