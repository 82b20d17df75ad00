"""Translate ``mgpu launch`` options into a torchrun argument list (pure: machine facts are passed in).

The result, a :class:`LaunchPlan`, is what ``torch.distributed.run`` gets (``torchrun_args``), the
environment mgpu adds for the workers (``env``), and where the logs and ``launch.json`` go. Nothing here
starts a process or imports torch, so every rule is unit-tested with the GPU count, the environment and the
port check faked.

Rendezvous, in order of precedence:

* one node, no port given: torch's standalone rendezvous (c10d store on ``localhost:0``, so the OS picks a
  free port, and a fresh run id), which is what ``torchrun --standalone`` does. Two jobs never collide.
* one node, ``--master-port P`` (optionally ``--master-addr``): static rendezvous on P, bind-tested first.
* several nodes: static (``--master-addr``/``--master-port``/``--node-rank``, filled in from SLURM where
  not given) or c10d (``--rdzv-endpoint``/``--rdzv-id``). The run id every node uses must be the same, so
  the default one is derived from the job (SLURM job id, or a hash of recipe, overrides, endpoint and node
  count), not drawn at random.
"""

from __future__ import annotations

import hashlib
import os
import shlex
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from mgpucli.distributed.select import DeviceSelection, select_devices
from mgpucli.errors import UsageError
from mgpucli.launch.ports import check_port_number, port_problem, require_free_port
from mgpucli.launch.slurm import SlurmInfo, read_slurm
from mgpucli.run_files import unwritable

WORKER_MODULE = "mgpucli.launch.worker"
DEFAULT_STATIC_PORT = 29500  # torchrun's own default for a static rendezvous
LOG_PREFIX_TEMPLATE = "[rank${rank}]:"
# Torch's defaults plus SIGUSR1, SLURM's early-warning signal (sbatch --signal=USR1@60): forwarded to the
# workers instead of killing the launcher outright.
SLURM_SIGNALS = "SIGTERM,SIGINT,SIGHUP,SIGQUIT,SIGUSR1"


@dataclass(frozen=True)
class LaunchOptions:
    """What the user asked ``mgpu launch`` for (the CLI's parsed options)."""

    recipe: str
    overrides: tuple[str, ...] = ()
    gpus: str | None = None
    cpu: bool = False
    nproc: int | None = None
    nnodes: int | None = None
    node_rank: int | None = None
    master_addr: str | None = None
    master_port: int | None = None
    rdzv_endpoint: str | None = None
    rdzv_id: str | None = None
    max_restarts: int = 0
    log_dir: str | None = None
    resume: str | None = None
    overwrite: bool = False


@dataclass(frozen=True)
class RecipeFacts:
    """The few resolved recipe values launch needs."""

    run_dir: str
    device: str = "auto"  # auto | cpu | cuda
    strategy: str = "auto"  # auto | single | ddp | dp
    cpu_threads: int | None = None
    fingerprint: str = ""  # identifies recipe + overrides, for a run id all nodes agree on


@dataclass(frozen=True)
class Machine:
    """What this machine offers; faked in tests."""

    visible_gpus: int
    cpu_count: int
    hostname: str
    environ: Mapping[str, str]


@dataclass
class LaunchPlan:
    """Everything needed to start the job, and to tell the user exactly what will run."""

    devices: DeviceSelection
    nproc_per_node: int
    nnodes: int
    node_rank: int | None
    rdzv_backend: str
    rdzv_endpoint: str
    rdzv_id: str
    run_dir: str
    log_dir: str
    launch_json: str
    worker_args: list[str]
    torchrun_args: list[str]
    env: dict[str, str] = field(default_factory=dict)  # what mgpu sets for the workers
    slurm: SlurmInfo | None = None
    notes: list[str] = field(default_factory=list)

    def command(self) -> str:
        """The equivalent shell command: the variables mgpu sets, then ``torchrun`` and its arguments."""
        prefix = [f"{k}={shlex.quote(v)}" for k, v in sorted(self.env.items())]
        return " ".join([*prefix, "torchrun", *(shlex.quote(a) for a in self.torchrun_args)])


def worker_overrides(opts: LaunchOptions) -> list[str]:
    """The overrides every worker gets: the user's, plus ``trainer.device=cpu`` for ``--cpu``."""
    overrides = list(opts.overrides)
    if not opts.cpu:
        return overrides
    for item in overrides:
        key, sep, value = item.lstrip("+").partition("=")
        if sep and key.strip() == "trainer.device":
            if value.strip() != "cpu":
                raise UsageError(
                    f"--cpu conflicts with the override {item!r}.",
                    "Drop one of them: --cpu already sets trainer.device=cpu for every worker.",
                )
            return overrides
    return [*overrides, "trainer.device=cpu"]


def worker_args(opts: LaunchOptions) -> list[str]:
    """``train RECIPE [overrides] [train options]``: what each worker runs through mgpu's CLI."""
    args = ["train", opts.recipe, *worker_overrides(opts)]
    if opts.resume is not None:
        args += ["--resume", opts.resume]
    if opts.overwrite:
        args.append("--overwrite")
    return args


def _select(opts: LaunchOptions, facts: RecipeFacts, machine: Machine) -> DeviceSelection:
    if facts.device == "cpu" and opts.gpus is not None and not opts.cpu:
        raise UsageError(
            f"--gpus {opts.gpus} asks for GPUs, but the recipe sets trainer.device=cpu.",
            "Drop --gpus (and use --cpu --nproc N), or override trainer.device=cuda.",
        )
    cpu = opts.cpu or facts.device == "cpu"
    selection = select_devices(opts.gpus, cpu, opts.nproc, machine.visible_gpus,
                               machine.environ.get("CUDA_VISIBLE_DEVICES"))
    if facts.strategy == "dp":
        if selection.kind == "cpu" and selection.nproc > 1:
            raise UsageError(
                f"trainer.strategy=dp runs one process, but --nproc {selection.nproc} asks for {selection.nproc}.",
                "On CPUs use trainer.strategy=ddp (or auto) with --cpu --nproc N.",
            )
    elif facts.strategy == "single" and selection.nproc > 1:
        raise UsageError(
            f"trainer.strategy=single trains on one device, but launch would start {selection.nproc} processes.",
            "Use trainer.strategy=ddp (or auto) for several processes, or ask for one: --gpus 1, / --nproc 1.",
        )
    return selection


def _parse_endpoint(endpoint: str) -> tuple[str, int]:
    host, sep, port = endpoint.rpartition(":")
    if not sep or not host or not port.isdigit():
        raise UsageError(
            f"--rdzv-endpoint {endpoint!r} is not HOST:PORT.", "Example: --rdzv-endpoint node01:29400."
        )
    return host, check_port_number(int(port), "--rdzv-endpoint port")


def _shared_id(facts: RecipeFacts, where: str, nnodes: int) -> str:
    """A run id every node computes alike from what they share, and that differs between jobs."""
    digest = hashlib.sha1(f"{facts.fingerprint}|{where}|{nnodes}".encode()).hexdigest()[:12]
    return f"mgpu-{digest}"


def _launch_json_name(nnodes: int, node_rank: int | None, hostname: str) -> str:
    if nnodes == 1 or node_rank == 0:
        return "launch.json"
    if node_rank is not None:
        return f"launch.node{node_rank}.json"
    return f"launch.{hostname}.json"


def build_plan(
    opts: LaunchOptions,
    facts: RecipeFacts,
    machine: Machine,
    port_check: Callable[[int], str | None] = port_problem,
    new_id: Callable[[], str] = lambda: f"mgpu-{uuid.uuid4().hex[:12]}",
) -> LaunchPlan:
    """Validate the options against the machine and build the torchrun arguments (UsageError on bad input)."""
    if opts.max_restarts < 0:
        raise UsageError(f"--max-restarts {opts.max_restarts}: must be 0 or more.", "Example: --max-restarts 2.")
    selection = _select(opts, facts, machine)
    nproc = 1 if facts.strategy == "dp" else selection.nproc
    slurm = read_slurm(machine.environ)
    notes: list[str] = []
    nnodes = opts.nnodes if opts.nnodes is not None else (slurm.nnodes if slurm else 1)
    if nnodes < 1:
        raise UsageError(f"--nnodes {nnodes}: must be at least 1.", "Example: --nnodes 2.")
    if opts.master_port is not None:
        check_port_number(opts.master_port, "--master-port")
    static_given = opts.master_addr is not None or opts.master_port is not None
    if opts.rdzv_endpoint and static_given:
        raise UsageError(
            "--rdzv-endpoint (c10d rendezvous) and --master-addr/--master-port (static) exclude each other.",
            "Pick one way for the nodes to meet.",
        )
    if opts.node_rank is not None and not 0 <= opts.node_rank < nnodes:
        raise UsageError(
            f"--node-rank {opts.node_rank} does not fit --nnodes {nnodes} (node ranks run from 0 to {nnodes - 1}).",
            "Give node 0 (the one at --master-addr) --node-rank 0, the next --node-rank 1, and so on.",
        )
    args = ["--nnodes", str(nnodes), "--nproc-per-node", str(nproc)]
    node_rank: int | None
    if nnodes == 1:
        node_rank = 0
        if opts.rdzv_endpoint:
            backend, endpoint = "c10d", opts.rdzv_endpoint
            _, port = _parse_endpoint(endpoint)
            require_free_port(port, "--rdzv-endpoint port", port_check)
            rdzv_id = opts.rdzv_id or new_id()
            args += ["--rdzv-backend", backend, "--rdzv-endpoint", endpoint, "--rdzv-id", rdzv_id]
        elif opts.master_port is not None:
            backend = "static"
            addr = opts.master_addr or "127.0.0.1"
            endpoint = f"{addr}:{opts.master_port}"
            require_free_port(opts.master_port, "--master-port", port_check)
            rdzv_id = opts.rdzv_id or new_id()
            args += ["--rdzv-backend", "static", "--master-addr", addr, "--master-port", str(opts.master_port)]
            args += ["--node-rank", "0", "--rdzv-id", rdzv_id]
        elif opts.master_addr is not None:
            raise UsageError(
                "--master-addr without --master-port: on one node mgpu picks a private rendezvous itself.",
                "Drop --master-addr, or give --master-port P as well.",
            )
        else:
            backend, endpoint = "c10d", "localhost:0"  # torchrun --standalone: a free port picked by the OS
            rdzv_id = opts.rdzv_id or new_id()
            args += ["--rdzv-backend", backend, "--rdzv-endpoint", endpoint, "--rdzv-id", rdzv_id]
    elif opts.rdzv_endpoint:
        backend, endpoint = "c10d", opts.rdzv_endpoint
        _parse_endpoint(endpoint)
        node_rank = opts.node_rank if opts.node_rank is not None else (slurm.node_rank if slurm else None)
        rdzv_id = opts.rdzv_id or (slurm.rdzv_id if slurm else _shared_id(facts, endpoint, nnodes))
        args += ["--rdzv-backend", backend, "--rdzv-endpoint", endpoint, "--rdzv-id", rdzv_id]
        notes.append(
            f"c10d rendezvous at {endpoint}, id {rdzv_id}: give every node the same --rdzv-endpoint and id."
        )
    else:
        backend = "static"
        addr = opts.master_addr or (slurm.master_addr if slurm and slurm.hosts else None)
        if addr is None:
            raise UsageError(
                f"--nnodes {nnodes} needs to know where the nodes meet.",
                "Give every node --master-addr HOST --master-port P (HOST = node 0's address) and its own "
                "--node-rank, or --rdzv-endpoint HOST:PORT for a c10d rendezvous.",
            )
        port = opts.master_port or (slurm.master_port if slurm else DEFAULT_STATIC_PORT)
        node_rank = opts.node_rank if opts.node_rank is not None else (slurm.node_rank if slurm else None)
        if node_rank is None:
            raise UsageError(
                f"--nnodes {nnodes} with a static rendezvous needs --node-rank on every node.",
                f"Give the node at --master-addr {addr} --node-rank 0, the others 1..{nnodes - 1}.",
            )
        if not 0 <= node_rank < nnodes:
            raise UsageError(
                f"This node's rank from SLURM ({node_rank}) does not fit {nnodes} nodes.",
                "Pass --node-rank and --nnodes yourself.",
            )
        endpoint = f"{addr}:{port}"
        if node_rank == 0:
            # Node 0 hosts the store: refuse a busy port here, before anything starts.
            require_free_port(port, "--master-port", port_check)
        rdzv_id = opts.rdzv_id or (slurm.rdzv_id if slurm else _shared_id(facts, endpoint, nnodes))
        args += ["--rdzv-backend", "static", "--master-addr", addr, "--master-port", str(port)]
        args += ["--node-rank", str(node_rank), "--rdzv-id", rdzv_id]
    if slurm is not None and nnodes > 1:
        where = f"node {node_rank}" if node_rank is not None else "this node"
        notes.append(f"SLURM job {slurm.job_id}: {nnodes} nodes, {where}, rendezvous at {endpoint}.")
    if opts.max_restarts:
        args += ["--max-restarts", str(opts.max_restarts)]
    log_dir = os.path.abspath(opts.log_dir or os.path.join(facts.run_dir, "logs"))
    if opts.log_dir and (problem := unwritable(log_dir)):  # torch's agent would fail on it with a traceback
        raise UsageError(f"--log-dir {opts.log_dir}: {problem}.", "Give a directory (created if missing), or leave "
                         "--log-dir out for RUN_DIR/logs.")
    # Every rank's stdout+stderr to files (redirects 3), local rank 0 also to this terminal (tee 0:3).
    args += ["--log-dir", log_dir, "--redirects", "3", "--tee", "0:3"]
    if slurm is not None:
        args += ["--signals-to-handle", SLURM_SIGNALS]
    worker_argv = worker_args(opts)
    args += ["-m", WORKER_MODULE, *worker_argv]

    env = {"TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE": LOG_PREFIX_TEMPLATE, "MGPU_RUN_DIR": facts.run_dir}
    if backend == "c10d" and opts.max_restarts > 0:
        # torch 2.13's c10d rendezvous hands every restart round the same bootstrap TCPStore, so the restarted
        # workers read the previous attempt's gloo/NCCL addresses and fail to connect ("Connection refused";
        # plain `torchrun --standalone --max-restarts 1` fails the same way). Opting out of the shared store
        # gives each round a fresh one, hosted by the round's rank 0. Only when there can be a second round:
        # a rank that reaches init_process_group before rank 0 has opened that store waits in the client's
        # connect backoff (about half a second), time to first step that plain torchrun doesn't pay.
        env["TORCH_DISABLE_SHARE_RDZV_TCP_STORE"] = "1"
    if selection.kind == "cuda" and selection.cuda_visible_devices is not None:
        env["CUDA_VISIBLE_DEVICES"] = selection.cuda_visible_devices
    if selection.kind == "cpu" and not machine.environ.get("OMP_NUM_THREADS"):
        # torchrun alone pins every worker to 1 thread; share the cores instead (or use the recipe's count).
        threads = facts.cpu_threads or max(1, machine.cpu_count // nproc)
        env["OMP_NUM_THREADS"] = str(threads)
    return LaunchPlan(
        devices=selection,
        nproc_per_node=nproc,
        nnodes=nnodes,
        node_rank=node_rank,
        rdzv_backend=backend,
        rdzv_endpoint=endpoint,
        rdzv_id=rdzv_id,
        run_dir=facts.run_dir,
        log_dir=log_dir,
        launch_json=os.path.join(facts.run_dir, _launch_json_name(nnodes, node_rank, machine.hostname)),
        worker_args=worker_argv,
        torchrun_args=args,
        env=env,
        slurm=slurm,
        notes=notes,
    )
