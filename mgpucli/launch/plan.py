"""Translate ``mgpu launch`` options into a torchrun argument list (pure: machine facts are passed in).

The result, a :class:`LaunchPlan`, is what ``torch.distributed.run`` gets (``torchrun_args``), the
environment mgpu adds for the workers (``env``), and where the logs and ``launch.json`` go. The job is a recipe
(every worker runs ``train RECIPE ...``) or the user's own script (``script SCRIPT.py ARGS``, see
:mod:`mgpucli.launch.script`); the launcher's side of both is the same. Nothing here
starts a process or imports torch, so every rule is unit-tested with the GPU count, the environment and the
port check faked.

Rendezvous, in order of precedence:

* one node, no port given: torch's standalone rendezvous (c10d store on ``localhost:0``, so the OS picks a
  free port, and a fresh run id), which is what ``torchrun --standalone`` does. Two jobs never collide.
* one node, ``--master-port P`` (optionally ``--master-addr``): static rendezvous on P, bind-tested first.
* several nodes: static (``--master-addr``/``--master-port``/``--node-rank``) or c10d (``--rdzv-endpoint``/
  ``--rdzv-id``), what the options leave out filled in from the engine that describes the job (SLURM, torchrun's
  ``PET_*`` variables or a Kubernetes pod's: :mod:`mgpucli.launch.job_source`). The run id every node uses must
  be the same, so it comes from the job (``--rdzv-id``, ``PET_RDZV_ID``, the SLURM job id, else the endpoint and
  the node count: what every node of one job shares), never from what the nodes run: nodes whose commands differ
  meet on the job, and then compare what they run (:mod:`mgpucli.launch.node_compare`). The master's address must
  resolve. The nodes wait for each other up to ``--join-timeout`` (:data:`DEFAULT_JOIN_TIMEOUT_S`), saying so
  (:mod:`mgpucli.launch.rendezvous_watch`).
"""

from __future__ import annotations

import hashlib
import os
import shlex
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace

from mgpucli import env_vars
from mgpucli.distributed.select import DeviceSelection, check_device_options, select_devices
from mgpucli.errors import UsageError
from mgpucli.launch import elastic_rounds
from mgpucli.launch.job_source import SchedulerJob, read_scheduler, unread_torchrun_variables
from mgpucli.launch.node_range import NodeRange
from mgpucli.launch.ports import check_port_number, host_problem, port_problem, require_free_port
from mgpucli.launch.script import ScriptTarget
from mgpucli.run_files import unwritable
from mgpucli.run_layout import LOGS, launch_json_name, launcher_name

WORKER_MODULE = "mgpucli.launch.worker"
DEFAULT_STATIC_PORT = 29500  # torchrun's own default for a static rendezvous
RESOLVE_WAIT_S = 60.0  # a master named by the job's environment: its DNS name may appear only as the pods start
LOG_PREFIX_TEMPLATE = "[rank${rank}]:"
# How long the nodes of a job wait for each other (at the start, and for a lost node after a restart): torch's own
# c10d default. The pods of one job start minutes apart (a cold pull of a CUDA image, a node the autoscaler adds, a
# SLURM prolog); ten minutes covers that while bounding what an early node idles when a peer never comes.
DEFAULT_JOIN_TIMEOUT_S = 600.0


@dataclass(frozen=True)
class LaunchOptions:
    """What the user asked ``mgpu launch`` for (the CLI's parsed options). ``script`` set: the job is that script
    (``recipe`` and ``overrides`` unused); else the recipe."""

    recipe: str = ""
    overrides: tuple[str, ...] = ()
    gpus: str | None = None
    cpu: bool = False
    nproc: int | None = None
    nnodes: int | None = None  # the node count; for an elastic job (--nnodes MIN:MAX) its MAX
    nnodes_min: int | None = None  # an elastic job's MIN (--nnodes MIN:MAX); None: a fixed count
    node_rank: int | None = None
    master_addr: str | None = None
    master_port: int | None = None
    rdzv_endpoint: str | None = None
    rdzv_id: str | None = None
    max_restarts: int = 0
    log_dir: str | None = None
    resume: str | None = None
    overwrite: bool = False
    script: ScriptTarget | None = None
    run_dir: str | None = None  # a script's run dir (a recipe's is its run_dir value)
    local_rank_arg: bool = False  # a script: pass it --local_rank=N (the spelling is script.local_rank_flag)
    show_rank: str | None = None  # the local rank whose output is shown ("all": every rank's); default 0
    stall_s: float | None = None  # stop a job whose rank makes no progress this long (default: trainer.stall_s)
    probe_steps: int | None = None  # the workers run the fit probe (mgpu train --probe) instead of training
    probe_result: str | None = None  # where rank 0 writes the probe's report
    audit: bool = False  # a script: every worker runs it with mgpu's checks (mgpucli.audit)
    join_timeout: float | None = None  # several nodes: how long they wait for each other (default DEFAULT_JOIN_...)


@dataclass(frozen=True)
class RecipeFacts:
    """The few resolved recipe values launch needs (for a script: what its options say, :func:`script_facts`)."""

    run_dir: str
    device: str = "auto"  # auto | cpu | cuda
    strategy: str = "auto"  # auto | single | ddp | dp
    cpu_threads: int | None = None


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
    scheduler: SchedulerJob | None = None  # the scheduler that filled in what the options left out
    notes: list[str] = field(default_factory=list)

    script: ScriptTarget | None = None  # the user's script, when the job is one (else a recipe)
    shown_args: list[str] | None = None  # a script: what a user would give torchrun without mgpu
    join_timeout: float | None = None  # several nodes: how long they wait for each other (None: one node)
    nnodes_min: int | None = None  # an elastic job's MIN (nnodes is its MAX); None: a fixed node count
    compared: dict[str, str] = field(default_factory=dict)  # what this node runs, compared with the other nodes'

    @property
    def nodes(self) -> NodeRange:
        """The node range: ``nnodes`` alone for a fixed count, ``nnodes_min``..``nnodes`` for an elastic job."""
        return NodeRange(self.nnodes_min or self.nnodes, self.nnodes)

    def split_at_job(self) -> tuple[list[str], list[str]]:
        """(torchrun's options up to the worker's job name, the job's own arguments). Only the first part goes
        through torchrun's parser: argparse reads every token that looks like an option, also after the script, and
        refuses a script's ``--nproc 4`` as an ambiguous abbreviation of ``--nproc-per-node``."""
        at = len(self.torchrun_args) - len(self.worker_args) + 1
        return self.torchrun_args[:at], self.torchrun_args[at:]

    @property
    def job(self) -> str:
        """The workers' job (mgpucli.launch.worker.JOBS): "train" (a recipe) or "script"."""
        return self.worker_args[0]

    def command(self) -> str:
        """The equivalent shell command: the variables mgpu sets, then ``torchrun`` and its arguments. For a script,
        the script itself where mgpu runs it through its worker (what a user would type without mgpu)."""
        prefix = [f"{k}={shlex.quote(v)}" for k, v in sorted(self.env.items())]
        args = self.torchrun_args if self.shown_args is None else self.shown_args
        return " ".join([*prefix, "torchrun", *(shlex.quote(a) for a in args)])


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
    """``train RECIPE [overrides] [train options]`` (or the script job, :meth:`ScriptTarget.worker_args`): what
    each worker runs."""
    if opts.script is not None:
        return opts.script.worker_args()
    args = ["train", opts.recipe, *worker_overrides(opts)]
    if opts.resume is not None:
        args += ["--resume", opts.resume]
    if opts.overwrite:
        args.append("--overwrite")
    if opts.probe_steps is not None:
        args += ["--probe", "--probe-steps", str(opts.probe_steps)]
        if opts.probe_result:
            args += ["--probe-result", opts.probe_result]
    return args


def check_job_options(opts: LaunchOptions) -> None:
    """Options that belong to the other kind of job: UsageError (exit 2) before anything is read or started."""
    if opts.script is not None:
        refused = [flag for flag, given in (("--resume", opts.resume is not None), ("--overwrite", opts.overwrite))
                   if given]
        if refused:
            raise UsageError(
                f"{refused[0]} is for recipes: mgpu does not checkpoint your script, so it has nothing to resume.",
                "Give your script its own option for that after the script (mgpu launch ... main.py --resume "
                "PATH): mgpu's options go before the script, the script's after it.",
            )
        return
    if opts.run_dir is not None:
        raise UsageError("--run-dir is for scripts: a recipe's run dir is its run_dir value.",
                         f"Give it as an override: mgpu launch ... {opts.recipe} run_dir={opts.run_dir}")
    if opts.local_rank_arg:
        raise UsageError("--local-rank-arg is for scripts that declare --local_rank: a recipe's workers know "
                         "their rank.", "Drop --local-rank-arg.")
    if opts.audit:
        raise UsageError("--audit checks your own training script for the tutorial's traps: a recipe's trainer "
                         "already does each of those right.", "Drop --audit, or give it with SCRIPT.py.")


def script_facts(opts: LaunchOptions) -> RecipeFacts:
    """A script's stand-in for the recipe's facts: its run dir ("" until :func:`build_plan` names one) and the
    device ``--cpu`` asks for."""
    if opts.script is None:
        raise ValueError("not a script launch")
    return RecipeFacts(run_dir=opts.run_dir or "", device="cpu" if opts.cpu else "auto")


def _tee(show_rank: str | None, nproc: int) -> str:
    """torchrun's ``--tee``: which local rank's stdout+stderr (3) are copied to the launcher's output."""
    if show_rank is None:
        return "0:3"
    if show_rank.strip() == "all":
        return "3"
    try:
        rank = int(show_rank)
    except ValueError:
        rank = -1
    if not 0 <= rank < nproc:
        raise UsageError(f"--show-rank {show_rank}: give a local rank of this node, 0..{nproc - 1}, or 'all'.",
                         "Example: --show-rank 1 (rank 1's output instead of rank 0's), --show-rank all.")
    return f"{rank}:3"


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


def _parse_endpoint(endpoint: str, source: str = "--rdzv-endpoint") -> tuple[str, int]:
    host, sep, port = endpoint.rpartition(":")
    if not sep or not host or not port.isdigit():
        raise UsageError(
            f"{source} {endpoint!r} is not HOST:PORT.", "Example: --rdzv-endpoint node01:29400."
        )
    return host, check_port_number(int(port), f"{source} port")


def _shared_id(where: str, nnodes: int) -> str:
    """The run id of a job that names none: what every node of the job shares (where they meet and how many they
    are), never what they run, so that nodes whose commands differ still meet, and are told how they differ."""
    digest = hashlib.sha1(f"{where}|{nnodes}".encode()).hexdigest()[:12]
    return f"mgpu-{digest}"


@dataclass(frozen=True)
class Rendezvous:
    """How the workers meet: one rendezvous mode's settings and torchrun's arguments for them."""

    backend: str  # c10d | static
    endpoint: str
    rdzv_id: str
    node_rank: int | None  # None: torch's agent assigns it (c10d on several nodes, rank not given)
    args: tuple[str, ...]
    note: str | None = None


def _c10d(endpoint: str, rdzv_id: str, node_rank: int | None, note: str | None = None) -> Rendezvous:
    args = ("--rdzv-backend", "c10d", "--rdzv-endpoint", endpoint, "--rdzv-id", rdzv_id)
    return Rendezvous("c10d", endpoint, rdzv_id, node_rank, args, note)


def _static(addr: str, port: int, node_rank: int, rdzv_id: str) -> Rendezvous:
    args = ("--rdzv-backend", "static", "--master-addr", addr, "--master-port", str(port),
            "--node-rank", str(node_rank), "--rdzv-id", rdzv_id)
    return Rendezvous("static", f"{addr}:{port}", rdzv_id, node_rank, args)


def standalone(opts: LaunchOptions, new_id: Callable[[], str]) -> Rendezvous:
    """One node, no port given: ``torchrun --standalone`` (c10d on ``localhost:0``, a free port picked by the OS)."""
    if opts.master_addr is not None:
        raise UsageError(
            "--master-addr without --master-port: on one node mgpu picks a private rendezvous itself.",
            "Drop --master-addr, or give --master-port P as well.",
        )
    return _c10d("localhost:0", opts.rdzv_id or new_id(), 0)


def one_node_c10d(opts: LaunchOptions, port_check: Callable[[int], str | None],
                  new_id: Callable[[], str]) -> Rendezvous:
    """One node, ``--rdzv-endpoint HOST:PORT``: c10d there, the port bind-tested first."""
    endpoint = opts.rdzv_endpoint or ""
    _, port = _parse_endpoint(endpoint)
    require_free_port(port, "--rdzv-endpoint port", port_check)
    return _c10d(endpoint, opts.rdzv_id or new_id(), 0)


def one_node_static(opts: LaunchOptions, port: int, port_check: Callable[[int], str | None],
                    new_id: Callable[[], str]) -> Rendezvous:
    """One node, ``--master-port P`` (optionally ``--master-addr``): static on P, bind-tested first."""
    require_free_port(port, "--master-port", port_check)
    return _static(opts.master_addr or "127.0.0.1", port, 0, opts.rdzv_id or new_id())


def _where_nodes_meet(host: str, source: str, from_env: bool, host_check: Callable[[str, float], str | None]) -> None:
    """The master's (or the c10d endpoint's) host must resolve: UsageError naming where it came from. One named by
    the job's environment gets a while for its DNS name to appear (pods start together)."""
    why = host_check(host, RESOLVE_WAIT_S if from_env else 0.0)
    if why:
        raise UsageError(f"{source}: the host {host!r} {why}, so the nodes cannot meet there.",
                         "Give node 0's address (a name every node resolves, or its IP): --master-addr HOST, or fix "
                         "the variable it came from.")


def nodes_c10d(opts: LaunchOptions, nnodes: int, job: SchedulerJob | None,
               host_check: Callable[[str, float], str | None]) -> Rendezvous:
    """Several nodes, c10d (``--rdzv-endpoint``, or the job's): a run id every node derives alike."""
    from_env = not opts.rdzv_endpoint
    endpoint = opts.rdzv_endpoint or (job.rdzv_endpoint if job else None) or ""
    source = f"--rdzv-endpoint {endpoint}" if not from_env or job is None else job.said("rdzv_endpoint")
    host, _ = _parse_endpoint(endpoint, source)
    _where_nodes_meet(host, source, from_env, host_check)
    node_rank = opts.node_rank if opts.node_rank is not None else (job.node_rank if job else None)
    rdzv_id = opts.rdzv_id or (job.rdzv_id if job else None) or _shared_id(endpoint, nnodes)
    return _c10d(endpoint, rdzv_id, node_rank,
                 f"c10d rendezvous at {endpoint}, id {rdzv_id}: give every node the same --rdzv-endpoint and id.")


def nodes_static(opts: LaunchOptions, nnodes: int, job: SchedulerJob | None, port_check: Callable[[int], str | None],
                 host_check: Callable[[str, float], str | None]) -> Rendezvous:
    """Several nodes, static: ``--master-addr``/``--master-port``/``--node-rank``, filled in from the job's engine."""
    addr = opts.master_addr or (job.master_addr if job else None)
    if addr is None:
        raise UsageError(
            f"--nnodes {nnodes} needs to know where the nodes meet.",
            "Give every node --master-addr HOST --master-port P (HOST = node 0's address) and its own "
            "--node-rank, or --rdzv-endpoint HOST:PORT for a c10d rendezvous.",
        )
    port = opts.master_port or (job.master_port if job else DEFAULT_STATIC_PORT)
    if opts.master_port is None and job is not None:
        check_port_number(port, job.said("master_port").split("=")[0])  # "PET_MASTER_PORT 0: a TCP port is ..."
    node_rank = opts.node_rank if opts.node_rank is not None else (job.node_rank if job else None)
    if node_rank is None:
        raise UsageError(
            f"--nnodes {nnodes} with a static rendezvous needs --node-rank on every node.",
            f"Give the node at --master-addr {addr} --node-rank 0, the others 1..{nnodes - 1}.",
        )
    from_env = opts.master_addr is None
    _where_nodes_meet(addr, job.said("master_addr") if from_env and job else f"--master-addr {addr}", from_env,
                      host_check)
    if node_rank == 0:  # node 0 hosts the store: refuse a busy port here, before anything starts
        require_free_port(port, "--master-port", port_check)
    rdzv_id = opts.rdzv_id or (job.rdzv_id if job else None) or _shared_id(f"{addr}:{port}", nnodes)
    return _static(addr, port, node_rank, rdzv_id)


def rendezvous(opts: LaunchOptions, nnodes: int, job: SchedulerJob | None, port_check: Callable[[int], str | None],
               new_id: Callable[[], str], host_check: Callable[[str, float], str | None]) -> Rendezvous:
    """The rendezvous mode the options and the job's engine ask for (see the module docstring for the order)."""
    if nnodes == 1:
        if opts.rdzv_endpoint:
            return one_node_c10d(opts, port_check, new_id)
        if opts.master_port is not None:
            return one_node_static(opts, opts.master_port, port_check, new_id)
        return standalone(opts, new_id)
    static_given = opts.master_addr is not None or opts.master_port is not None
    if opts.rdzv_endpoint or (job is not None and job.rdzv_endpoint and not static_given):
        return nodes_c10d(opts, nnodes, job, host_check)
    return nodes_static(opts, nnodes, job, port_check, host_check)


def join_timeout(opts: LaunchOptions, nnodes: int) -> float | None:
    """How long the nodes wait for each other: ``--join-timeout``, else :data:`DEFAULT_JOIN_TIMEOUT_S`; None on one
    node, where there is nobody to wait for (and the option is refused rather than ignored)."""
    given = opts.join_timeout
    if given is not None and not given > 0:
        raise UsageError(f"--join-timeout {given:g}: must be a number of seconds above 0.", "Example: --join-timeout "
                         f"{DEFAULT_JOIN_TIMEOUT_S:g} (the default: how long the nodes of a job wait for each other).")
    if nnodes == 1:
        if given is not None:
            raise UsageError(f"--join-timeout {given:g} is for jobs of several nodes: one node waits for nobody.",
                             "Drop --join-timeout, or give --nnodes N (or the job's variables) for several nodes.")
        return None
    return float(given if given is not None else DEFAULT_JOIN_TIMEOUT_S)


def join_timeout_args(backend: str, seconds: float, elastic: bool = False) -> list[str]:
    """torchrun's spelling of the join timeout, for the command shown (mgpu's rendezvous watch enforces it): the
    c10d rendezvous's ``join_timeout``, the static one's store ``timeout``; an elastic job's round settings with it
    (:func:`mgpucli.launch.elastic_rounds.rendezvous_conf`)."""
    key = "join_timeout" if backend == "c10d" else "timeout"
    conf = {key: f"{seconds:.0f}", **(elastic_rounds.rendezvous_conf() if elastic else {})}
    return ["--rdzv-conf", ",".join(f"{k}={v}" for k, v in conf.items())]


def _restart_args(nodes: NodeRange, rdzv: Rendezvous, opts: LaunchOptions, waits: float | None) -> list[str]:
    """torchrun's rendezvous settings and restarts: the join timeout (several nodes), and ``--max-restarts``; an
    elastic job's membership changes take restarts of torch's beside the job's own (``--max-restarts``, which mgpu
    counts itself: :mod:`mgpucli.launch.restart`)."""
    args = join_timeout_args(rdzv.backend, waits, nodes.elastic) if waits is not None else []
    restarts = opts.max_restarts + (elastic_rounds.NODE_CHANGES if nodes.elastic else 0)
    return args + (["--max-restarts", str(restarts)] if restarts else [])


def _check_elastic(nodes: NodeRange, rdzv: Rendezvous, opts: LaunchOptions, job: SchedulerJob | None) -> None:
    """An elastic range needs a c10d rendezvous (a static one has fixed node ranks: it cannot take a node back)."""
    if not nodes.elastic or rdzv.backend == "c10d":
        return
    given = f"--nnodes {nodes}" if opts.nnodes is not None or job is None else job.said("nnodes")
    raise UsageError(
        f"{given} is an elastic job, and its nodes meet through a static rendezvous (--master-addr/--master-port, "
        "fixed node ranks), which cannot take a lost node back nor admit a new one.",
        "Give every node the same c10d endpoint instead: --rdzv-endpoint HOST:PORT (a host that stays for the whole "
        "job: its launcher keeps the rendezvous), or set PET_RDZV_BACKEND=c10d and PET_RDZV_ENDPOINT=HOST:PORT.")


def _given_nnodes(opts: LaunchOptions, job: SchedulerJob | None, nnodes: int) -> str:
    """Where the node count ``nnodes`` came from, as a user would write it: ``--nnodes N`` (also the default, 1), or
    the job's variable."""
    return f"--nnodes {nnodes}" if opts.nnodes is not None or job is None else job.said("nnodes")


def node_count(opts: LaunchOptions, job: SchedulerJob | None) -> int:
    """The node count (an elastic job's MAX): :func:`node_range`'s."""
    return node_range(opts, job).high


def node_range(opts: LaunchOptions, job: SchedulerJob | None) -> NodeRange:
    """``--nnodes`` (N or MIN:MAX), else the job's count (or range), else 1; the node options (and the job's node rank)
    checked against it."""
    if opts.nnodes is not None:
        nodes = NodeRange(opts.nnodes_min or opts.nnodes, opts.nnodes)
    else:
        nodes = NodeRange(job.nnodes_min or job.nnodes, job.nnodes) if job else NodeRange(1, 1)
    nnodes = nodes.high
    if nodes.low < 1:
        raise UsageError(f"{_given_nnodes(opts, job, nnodes)}: must be at least 1.", "Example: --nnodes 2.")
    if opts.master_port is not None:
        check_port_number(opts.master_port, "--master-port")
    if opts.rdzv_endpoint and (opts.master_addr is not None or opts.master_port is not None):
        raise UsageError(
            "--rdzv-endpoint (c10d rendezvous) and --master-addr/--master-port (static) exclude each other.",
            "Pick one way for the nodes to meet.",
        )
    if opts.node_rank is not None and not 0 <= opts.node_rank < nnodes:
        raise UsageError(
            f"--node-rank {opts.node_rank} does not fit {_given_nnodes(opts, job, nnodes)} (node ranks run from 0 to "
            f"{nnodes - 1}).",
            "Give node 0 (the one at --master-addr) --node-rank 0, the next --node-rank 1, and so on.",
        )
    if opts.node_rank is None and job is not None and job.node_rank is not None and not 0 <= job.node_rank < nnodes:
        raise UsageError(
            f"{job.said('node_rank')} is not below {_given_nnodes(opts, job, nnodes)}: node ranks run from 0 to "
            f"{nnodes - 1}.", "Fix the job's variables, or give this node --node-rank and --nnodes yourself.",
        )
    return nodes


def job_nproc(opts: LaunchOptions, facts: RecipeFacts, job: SchedulerJob | None) -> tuple[LaunchOptions, int | None]:
    """(the options with the job's processes per node filled in where none is given, the count the selection must
    match). torchrun's ``auto``/``gpu`` mean one process per visible GPU, which is mgpu's own default."""
    raw = job.nproc_per_node if job is not None else None
    if job is None or raw is None or raw in ("auto", "gpu"):
        return opts, None
    if not raw.isdigit() or int(raw) < 1:
        raise UsageError(f"{job.said('nproc_per_node')}: mgpu needs a number of processes per node (or auto, gpu).",
                         "Set it to a count, or unset it and give --gpus N (--cpu --nproc N).")
    count = int(raw)
    if opts.nproc is not None or opts.gpus is not None:
        return opts, count
    if opts.cpu or facts.device == "cpu":
        return replace(opts, nproc=count), count
    return replace(opts, gpus=str(count)), count


def cpu_world_size(opts: LaunchOptions, environ: Mapping[str, str]) -> int | None:
    """The job's process count where it is known without the machine (``--cpu``; None on GPUs), with what the job's
    engine says: ``mgpu launch --check`` checks the recipe for it."""
    if not opts.cpu:
        return None
    job = read_scheduler(environ)
    opts, _ = job_nproc(opts, RecipeFacts(run_dir=""), job)
    return (opts.nproc or 1) * node_count(opts, job)


def _select_for_job(opts: LaunchOptions, facts: RecipeFacts, machine: Machine,
                    job: SchedulerJob | None) -> tuple[DeviceSelection, LaunchOptions]:
    """The device selection, with the job's processes per node where no option gives a count (then a selection this
    machine cannot make names the variable, not an option the user never typed); the options as filled in."""
    given = opts
    opts, count = job_nproc(opts, facts, job)
    try:
        selection = _select(opts, facts, machine)
    except UsageError as err:
        if opts is given or job is None:
            raise
        raise UsageError(f"{job.said('nproc_per_node')} (processes per node): {err.message}", err.hint) from None
    _check_job_nproc(given, job, count, selection.nproc)
    return selection, opts


def _check_job_nproc(opts: LaunchOptions, job: SchedulerJob | None, count: int | None, selected: int) -> None:
    if job is None or count is None or selected == count:
        return
    given = f"--nproc {opts.nproc}" if opts.nproc is not None else f"--gpus {opts.gpus}"
    raise UsageError(
        f"{given} starts {selected} process(es) on this node, but {job.said('nproc_per_node')} says {count}: the "
        "other nodes would count this one wrong.",
        f"Give the same count in both, or drop {given.split()[0]}: mgpu then starts what the job says.",
    )


def workers_env(opts: LaunchOptions, facts: RecipeFacts, machine: Machine, selection: DeviceSelection,
                nproc: int, run_dir: str, backend: str, restarts: bool = False) -> dict[str, str]:
    """The environment mgpu sets for the workers (shown in the torchrun command too)."""
    # A script may write its own files there: an absolute path, whatever directory it changes to.
    env = {env_vars.LOG_LINE_PREFIX: LOG_PREFIX_TEMPLATE,
           env_vars.RUN_DIR: run_dir if opts.script is None else os.path.abspath(run_dir)}
    if backend == "c10d" and (restarts or opts.max_restarts > 0):
        # torch 2.13's c10d rendezvous hands every restart round the same bootstrap TCPStore, so the restarted
        # workers read the previous attempt's gloo/NCCL addresses and fail to connect ("Connection refused";
        # plain `torchrun --standalone --max-restarts 1` fails the same way). Opting out of the shared store
        # gives each round a fresh one, hosted by the round's rank 0. Only when there can be a second round:
        # a rank that reaches init_process_group before rank 0 has opened that store waits in the client's
        # connect backoff (about half a second), time to first step that plain torchrun doesn't pay.
        env["TORCH_DISABLE_SHARE_RDZV_TCP_STORE"] = "1"
    if selection.kind == "cuda" and selection.cuda_visible_devices is not None:
        env["CUDA_VISIBLE_DEVICES"] = selection.cuda_visible_devices
    if selection.kind == "cpu" and opts.script is not None:
        # A recipe's workers are told trainer.device=cpu; a script decides for itself, so CPU workers see no GPU.
        env["CUDA_VISIBLE_DEVICES"] = ""
    if opts.script is not None and opts.stall_s == 0:  # no stall watch: the script's waiting calls go unwrapped
        env[env_vars.NO_STALL_WATCH] = "1"
    if opts.script is not None and "PYTHONUNBUFFERED" not in machine.environ:
        # torch starts the workers with `python -u`; this also reaches the Python processes a script starts itself.
        env["PYTHONUNBUFFERED"] = "1"
    if selection.kind == "cpu" and not machine.environ.get("OMP_NUM_THREADS"):
        # torchrun alone pins every worker to 1 thread; share the cores instead (or use the recipe's count).
        threads = facts.cpu_threads or max(1, machine.cpu_count // nproc)
        env["OMP_NUM_THREADS"] = str(threads)
    return env


def _check_log_dir(opts: LaunchOptions) -> None:
    if opts.log_dir and (problem := unwritable(os.path.abspath(opts.log_dir))):  # torch's agent: a traceback
        raise UsageError(f"--log-dir {opts.log_dir}: {problem}.", "Give a directory (created if missing), or leave "
                         "--log-dir out for RUN_DIR/logs.")


def _job_notes(job: SchedulerJob | None, nodes: NodeRange, rdzv: Rendezvous, environ: Mapping[str, str]) -> list[str]:
    """What the plan took from the job's engine (the variables read), and the torchrun variables it did not read."""
    notes = [rdzv.note] if rdzv.note else []
    if job is not None:
        where = f"node {rdzv.node_rank}" if rdzv.node_rank is not None else "this node"
        count = f"{nodes.low} to {nodes.high} nodes (elastic)" if nodes.elastic else f"{nodes.high} nodes"
        shape = f"{count}, {where}, rendezvous at {rdzv.endpoint}" if nodes.high > 1 else "one node"
        notes.append(f"{job.describe()}: {shape}.")
    unread = unread_torchrun_variables(environ)
    if unread:
        notes.append(f"Not read by mgpu (torchrun would take them as its options' defaults): {' '.join(unread)}; "
                     "give mgpu launch the option instead.")
    return notes


def new_run_id() -> str:
    """A fresh run id, for a job that names none and whose nodes need not derive one alike (one node)."""
    return f"mgpu-{uuid.uuid4().hex[:12]}"


@dataclass(frozen=True)
class JobNodes:
    """The job's nodes and how they meet, from the options and the job's engine alone (no recipe, no GPU count)."""

    job: SchedulerJob | None
    nodes: NodeRange
    rdzv: Rendezvous
    join_timeout: float | None  # None: one node
    notes: tuple[str, ...]


def _record_name(nnodes: int, rdzv: Rendezvous, hostname: str) -> str:
    """This node's launch record in the run dir (:func:`mgpucli.run_layout.launch_json_name`): by node rank where the
    rendezvous keeps it (static), else by this launcher alone (c10d ranks the nodes itself, whatever rank the job
    gives a node, and two nodes may give the same one)."""
    node_rank = rdzv.node_rank if rdzv.backend == "static" else None
    return launch_json_name(nnodes, node_rank, launcher_name(hostname, uuid.uuid4().hex[:6]))


def job_nodes(
    opts: LaunchOptions,
    environ: Mapping[str, str],
    port_check: Callable[[int], str | None] = port_problem,
    new_id: Callable[[], str] = new_run_id,
    host_check: Callable[[str, float], str | None] = host_problem,
) -> JobNodes:
    """Every option that needs neither the recipe nor the machine's GPUs, checked (UsageError on bad input): so
    ``mgpu launch`` refuses them before it imports torch. ``host_check(host, wait_s)``: why the master's host does
    not resolve (None: it does), trying for up to ``wait_s``."""
    check_device_options(opts.gpus, opts.cpu, opts.nproc)
    if opts.max_restarts < 0:
        raise UsageError(f"--max-restarts {opts.max_restarts}: must be 0 or more.", "Example: --max-restarts 2.")
    job = read_scheduler(environ)
    nodes = node_range(opts, job)
    rdzv = rendezvous(opts, nodes.high, job, port_check, new_id, host_check)
    _check_elastic(nodes, rdzv, opts, job)
    waits = join_timeout(opts, nodes.high)
    _check_log_dir(opts)
    return JobNodes(job, nodes, rdzv, waits, tuple(_job_notes(job, nodes, rdzv, environ)))


def build_plan(
    opts: LaunchOptions,
    facts: RecipeFacts,
    machine: Machine,
    port_check: Callable[[int], str | None] = port_problem,
    new_id: Callable[[], str] = new_run_id,
    name_run_dir: Callable[[int, str], str] | None = None,
    host_check: Callable[[str, float], str | None] = host_problem,
    checked_nodes: JobNodes | None = None,
) -> LaunchPlan:
    """Validate the options against the machine and build the torchrun arguments (UsageError on bad input).

    ``name_run_dir(nnodes, rdzv_id)`` names the run dir when ``facts.run_dir`` is empty (a script launched
    without ``--run-dir``: :func:`mgpucli.launch.script.default_run_dir`). ``checked_nodes``: :func:`job_nodes`
    already checked (else checked here, with ``port_check``, ``new_id`` and ``host_check``)."""
    checked = checked_nodes or job_nodes(opts, machine.environ, port_check, new_id, host_check)
    job, nodes, rdzv, waits = checked.job, checked.nodes, checked.rdzv, checked.join_timeout
    selection, opts = _select_for_job(opts, facts, machine, job)
    nproc = 1 if facts.strategy == "dp" else selection.nproc
    nnodes = nodes.high
    notes = list(checked.notes)
    args = ["--nnodes", str(nodes), "--nproc-per-node", str(nproc), *rdzv.args,
            *_restart_args(nodes, rdzv, opts, waits)]
    tee = _tee(opts.show_rank, nproc)
    run_dir = facts.run_dir
    if not run_dir:  # named last: every check above has passed
        if name_run_dir is None:
            raise ValueError("no run dir, and nothing to name one")
        run_dir = name_run_dir(nnodes, rdzv.rdzv_id)
    log_dir = os.path.abspath(opts.log_dir or os.path.join(run_dir, LOGS))
    # Every rank's stdout+stderr to files (redirects 3), local rank 0 (or --show-rank) also to this terminal (tee).
    args += ["--log-dir", log_dir, "--redirects", "3", "--tee", tee]
    if job is not None and job.signals:
        args += ["--signals-to-handle", job.signals]
    worker_argv = worker_args(opts)
    shown = None if opts.script is None else [*args, *opts.script.words()]
    restarts = opts.max_restarts > 0 or nodes.elastic
    args += ["-m", WORKER_MODULE, *worker_argv]
    return LaunchPlan(
        devices=selection, nproc_per_node=nproc, nnodes=nnodes, node_rank=rdzv.node_rank,
        rdzv_backend=rdzv.backend, rdzv_endpoint=rdzv.endpoint, rdzv_id=rdzv.rdzv_id, run_dir=run_dir,
        log_dir=log_dir, launch_json=os.path.join(run_dir, _record_name(nnodes, rdzv, machine.hostname)),
        worker_args=worker_argv, torchrun_args=args,
        env=workers_env(opts, facts, machine, selection, nproc, run_dir, rdzv.backend, restarts=restarts),
        scheduler=job, notes=notes, script=opts.script, shown_args=shown, join_timeout=waits,
        nnodes_min=nodes.low if nodes.elastic else None,
    )
