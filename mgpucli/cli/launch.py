"""``mgpu launch``: start one training worker per GPU (or N on CPUs) through torch's launcher engine; each runs a
recipe, or the user's own script (``SCRIPT.py`` or ``-m MODULE``, everything after it being the script's)."""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass

import typer

from mgpucli import env_vars
from mgpucli.cli.train import PROBE_STEPS, PROBE_STEPS_OPTION, probe_only_problem
from mgpucli.errors import MgpuError
from mgpucli.run_layout import AUDIT_JSON, LAST_FULL, LAST_SHARDED, LAUNCH_JSON, LOGS, POSTMORTEM_JSON


@dataclass(frozen=True)
class ScriptArgs:
    """The command's context object: the script's arguments, kept from the CLI's parser (None: not a script line);
    see :mod:`mgpucli.cli.launch_argv`."""

    args: tuple[str, ...] | None


# The command's arguments and options, as the CLI declares them.
_RECIPE = typer.Argument(
    None, metavar="RECIPE|SCRIPT.py", show_default=False,
    help="A recipe YAML file or a shipped recipe's name (see `mgpu recipes`); or your own training script, a .py "
    "file every worker runs as `python SCRIPT.py ARGS` would (or -m MODULE instead).",
)
_OVERRIDES = typer.Argument(
    None, metavar="[OVERRIDES|ARGS]...", show_default=False,
    help="A recipe's Hydra overrides for every worker (key=value, +key=value, ~key); a script's own arguments, "
    "passed untouched: mgpu's options go before the script, everything after it is the script's.",
)
_MODULE = typer.Option(
    None, "-m", metavar="MODULE", show_default=False,
    help="Run a module as every worker's script, as `python -m MODULE ARGS` does (found from this directory).",
)
_GPUS = typer.Option(
    None, "--gpus", metavar="N|LIST|all",
    help="GPUs to use: a count (first N visible), a list (0,2,3; one GPU: 1,) or 'all' "
    "(default: all visible).", show_default=False,
)
_CPU = typer.Option(False, "--cpu", help="Run on CPUs with gloo (a recipe gets trainer.device=cpu; a "
                         "script's workers see no GPU).")
_NPROC = typer.Option(
    None, "--nproc", metavar="N", help="Number of CPU processes (with --cpu; default 1)."
)
_NNODES = typer.Option(
    None, "--nnodes", metavar="N|MIN:MAX",
    help="Number of nodes (default 1, or from the job: SLURM, PET_NNODES, a pod's WORLD_SIZE); MIN:MAX: an elastic "
    "job (c10d rendezvous) that goes on when a node is lost and grows when one comes, up to MAX."
)
_NODE_RANK = typer.Option(
    None, "--node-rank", metavar="RANK",
    help="This node's rank, 0..nnodes-1 (static rendezvous; default from SLURM, PET_NODE_RANK, a pod's RANK)."
)
_MASTER_ADDR = typer.Option(
    None, "--master-addr", metavar="HOST",
    help="Address of node 0, where the rendezvous store listens (multi-node)."
)
_MASTER_PORT = typer.Option(
    None, "--master-port", metavar="PORT",
    help="Port of the rendezvous store; checked to be free before anything starts."
)
_RDZV_ENDPOINT = typer.Option(
    None, "--rdzv-endpoint", metavar="HOST:PORT",
    help="HOST:PORT of a c10d rendezvous (multi-node alternative to --master-addr)."
)
_RDZV_ID = typer.Option(
    None, "--rdzv-id", metavar="ID", help="Rendezvous id; the same on every node (default: the job's: PET_RDZV_ID, "
    "the SLURM job id, else derived from the endpoint and the node count)."
)
_JOIN_TIMEOUT = typer.Option(
    None, "--join-timeout", metavar="SECONDS", show_default=False,
    help="Several nodes: how long each waits for the others, at the start and for a lost node after a restart "
    "(default 600: the pods of one job start minutes apart). It says who it waits for every 30 s; at the end it "
    "stops, exit 1, naming the nodes that never came.",
)
_MAX_RESTARTS = typer.Option(
    0, "--max-restarts", metavar="K",
    help="Restart a failed worker group up to K times (a recipe resumes from its last checkpoint; a script "
    "starts again as given)."
)
_LOG_DIR = typer.Option(
    None, "--log-dir", metavar="DIR",
    help="Where every rank's stdout/stderr go (default: RUN_DIR/logs).", show_default=False
)
_DRY_RUN = typer.Option(False, "--dry-run", help="Check everything, print the torchrun command, exit.")
_RESUME = typer.Option(
    None, "--resume", metavar="PATH|auto",
    help=f"Passed to every worker: a checkpoint, or 'auto' (the run's {LAST_FULL} or {LAST_SHARDED} if any)."
)
_OVERWRITE = typer.Option(
    False, "--overwrite", help="Passed to every worker: start afresh in a run dir that holds checkpoints."
)
_CHECK = typer.Option(
    False, "--check", help="Check the workers' recipe in full (schema, every _target_, the datasets), print it "
    "resolved, exit. No devices needed, nothing started or written."
)
_RUN_DIR = typer.Option(
    None, "--run-dir", metavar="DIR", show_default=False,
    help=f"A script's run dir: {LAUNCH_JSON}, {LOGS}/, {POSTMORTEM_JSON} (default: a new runs/SCRIPT-DATE-TIME per "
    f"launch; the script gets it as {env_vars.RUN_DIR}). A recipe's is run_dir=PATH.",
)
_LOCAL_RANK_ARG = typer.Option(
    False, "--local-rank-arg", help="Pass a script --local_rank=N (or --local-rank=N: the spelling it declares) "
    "before its arguments, as python -m torch.distributed.launch did.",
)
_SHOW_RANK = typer.Option(
    None, "--show-rank", metavar="N|all", show_default=False,
    help="Show local rank N's output here instead of rank 0's, or every rank's, each line prefixed with its "
    "rank (every rank's output is in the logs either way).",
)
_STALL_S = typer.Option(
    None, "--stall-s", metavar="SECONDS", show_default=False,
    help="Stop the job when a rank makes no progress for this long, showing where every rank was first (a "
    "recipe's trainer.stall_s). A script's progress is seen without its help: optimizer steps, entering and "
    "leaving init_process_group and collectives. Default: 600 s, where CPU work counts as progress too (a long "
    "validation or save never trips it, a hang ends in 10 minutes); 0: no stall watch. Ctrl-C also shows "
    "where every rank was.",
)
_AUDIT = typer.Option(
    False, "--audit", help="Run your script with checks for the DDP tutorial's traps (a model not wrapped in DDP, "
    "no DistributedSampler, no set_epoch, padded evaluation, every rank saving one file, unused parameters, "
    f"devices): each finding shown as found, a summary at the end, RUN_DIR/{AUDIT_JSON}.",
)
_PROBE = typer.Option(
    False, "--probe", help="Will it fit? Every worker builds everything and times a few optimizer steps "
    "(mgpu train --probe); the report gathers every rank. No checkpoint written, the run dir left alone."
)
_PROBE_SCALING = typer.Option(
    False, "--probe-scaling", help="With --probe: time the same steps on 1 process first, then on all of them: "
    "throughput, scaling efficiency, and where each rank's step time goes."
)
_AS_JSON = typer.Option(False, "--json", help="With --probe: print the report as one JSON object on stdout.")


def launch(
    ctx: typer.Context,
    recipe: str | None = _RECIPE,
    overrides: list[str] | None = _OVERRIDES,
    module: str | None = _MODULE,
    gpus: str | None = _GPUS,
    cpu: bool = _CPU,
    nproc: int | None = _NPROC,
    nnodes: str | None = _NNODES,
    node_rank: int | None = _NODE_RANK,
    master_addr: str | None = _MASTER_ADDR,
    master_port: int | None = _MASTER_PORT,
    rdzv_endpoint: str | None = _RDZV_ENDPOINT,
    rdzv_id: str | None = _RDZV_ID,
    join_timeout: float | None = _JOIN_TIMEOUT,
    max_restarts: int = _MAX_RESTARTS,
    log_dir: str | None = _LOG_DIR,
    dry_run: bool = _DRY_RUN,
    resume: str | None = _RESUME,
    overwrite: bool = _OVERWRITE,
    check: bool = _CHECK,
    run_dir: str | None = _RUN_DIR,
    local_rank_arg: bool = _LOCAL_RANK_ARG,
    show_rank: str | None = _SHOW_RANK,
    stall_s: float | None = _STALL_S,
    audit: bool = _AUDIT,
    probe: bool = _PROBE,
    probe_steps: int | None = PROBE_STEPS_OPTION,
    probe_scaling: bool = _PROBE_SCALING,
    as_json: bool = _AS_JSON,
) -> None:
    """Train a recipe, or run your own training script, on all visible GPUs (or --gpus, or --cpu --nproc N) with one
    worker process each.

    mgpu's options go before the recipe or the script: everything after SCRIPT.py (or -m MODULE) is the script's.

    Exit codes: 0 success; 1 the job failed (a script: its first failing rank's own exit code, 128+N for a rank
    killed by signal N); 2 bad input, nothing started; 75 a recipe preempted with a complete checkpoint.
    """
    from mgpucli.console import print_error
    from mgpucli.launch.node_range import parse_nnodes
    from mgpucli.launch.plan import LaunchOptions

    try:
        script = _script(ctx, recipe, overrides, module)
        nodes = parse_nnodes(nnodes) if nnodes is not None else None
        opts = LaunchOptions(
            recipe=recipe or "", overrides=tuple(overrides or ()) if script is None else (), gpus=gpus, cpu=cpu,
            nproc=nproc, nnodes=nodes.high if nodes else None,
            nnodes_min=nodes.low if nodes and nodes.elastic else None, node_rank=node_rank, master_addr=master_addr,
            master_port=master_port,
            rdzv_endpoint=rdzv_endpoint, rdzv_id=rdzv_id, join_timeout=join_timeout, max_restarts=max_restarts,
            log_dir=log_dir, resume=resume,
            overwrite=overwrite, script=script, run_dir=run_dir, local_rank_arg=local_rank_arg, show_rank=show_rank,
            audit=audit,
            stall_s=stall_s,
        )
        code = _run(opts, recipe, check, probe, probe_steps, probe_scaling, as_json, dry_run)
    except MgpuError as err:
        print_error(str(err))
        sys.exit(err.exit_code)
    except KeyboardInterrupt:
        print_error("interrupted before any worker started.")
        sys.exit(130)
    sys.exit(code)


def _run(opts, recipe: str | None, check: bool, probe: bool, probe_steps: int | None, probe_scaling: bool,
         as_json: bool, dry_run: bool) -> int:
    """The launch the options ask for: ``--check``, ``--probe``, or the job itself; returns the exit code."""
    from mgpucli.errors import UsageError
    from mgpucli.launch.main import launch as run_launch

    recipe_only = "--check" if check else "--probe" if probe else None
    if recipe_only and opts.script is not None:
        raise UsageError(f"{recipe_only} is for recipes: it goes through mgpu's trainer, which a script does not.",
                         f"Drop {recipe_only}; --dry-run shows what would run, without starting anything.")
    unused = probe_only_problem(probe, as_json, probe_steps) or (
        "--probe-scaling compares the probe's figures on 1 and on N processes: use it with --probe."
        if probe_scaling and not probe else None)
    if unused:
        raise UsageError(unused)
    if check:
        return _check(opts, recipe)
    if probe:
        return _probe(opts, PROBE_STEPS if probe_steps is None else probe_steps, as_json, dry_run, probe_scaling)
    return run_launch(opts, dry_run=dry_run)


def _check(opts, recipe: str | None) -> int:
    """``--check``: the recipe as every worker gets it (with --cpu's override); no devices or processes needed."""
    from mgpucli.cli.check import check_and_print
    from mgpucli.launch.main import check_run_dir
    from mgpucli.launch.plan import check_job_options, cpu_world_size, worker_overrides

    check_job_options(opts)
    # the process count is known without the machine for --cpu; for GPUs the workers check it
    world = cpu_world_size(opts, os.environ)
    check_and_print(recipe, worker_overrides(opts),
                    check_run_dir=lambda run_dir, sharded: check_run_dir(run_dir, opts, sharded),
                    world_size=world)
    return 0


def _script(ctx: typer.Context, target: str | None, rest: list[str] | None, module: str | None):
    """The script to launch (a ScriptTarget), or None for a recipe; UsageError for a line that is neither."""
    from mgpucli.errors import UsageError
    from mgpucli.launch.script import ScriptTarget, is_script

    kept = ctx.obj.args if isinstance(ctx.obj, ScriptArgs) else None
    args = kept if kept is not None else tuple(rest or ())  # None: the CLI was called without mgpu's entry point
    if module is not None:
        if target is not None:
            raise UsageError(f"-m {module} and {target} both name what to run.",
                             "Give one: a recipe, SCRIPT.py, or -m MODULE (its arguments after it).")
        return ScriptTarget(module=module, args=args)
    if target is None:
        raise UsageError("mgpu launch needs a recipe, a SCRIPT.py or -m MODULE.",
                         "Examples: mgpu launch --cpu --nproc 2 quickstart; mgpu launch --gpus 4 main.py --epochs 10.")
    return ScriptTarget(path=target, args=args) if is_script(target) else None


def _probe(opts, steps: int, as_json: bool, dry_run: bool, scaling: bool = False) -> int:
    """``--probe``: the workers run ``mgpu train --probe`` in a temporary run dir (the recipe's own, and any
    checkpoints in it, stay untouched, and are no reason to refuse the launch); rank 0's report comes back through
    a file and is rendered here. With ``scaling``, the same probe on one process first (cli/probe_report.py compares
    them)."""
    import dataclasses

    from mgpucli.cli.probe_report import render
    from mgpucli.errors import UsageError

    clash = "--resume" if opts.resume else "--overwrite" if opts.overwrite else \
        "--max-restarts" if opts.max_restarts else None
    if clash:
        raise UsageError(f"--probe and {clash} don't combine: the probe measures a fresh start and writes nothing.",
                         f"Drop {clash} (or --probe).")
    if steps < 1:
        raise UsageError(f"--probe-steps {steps}: the probe needs at least one step to time.")
    if scaling:
        _scaling_refused(opts)
        first_gpu = opts.gpus.split(",")[0] + "," if opts.gpus and "," in opts.gpus else "1"  # N's first GPU
        one_process = dataclasses.replace(opts, gpus=first_gpu)
        if opts.cpu:  # the threads each of the N processes gets: the same resources per process, as a GPU is
            from mgpucli.cpus import threads_per_process

            given = any(o.lstrip("+").startswith("trainer.cpu_threads=") for o in opts.overrides)
            threads = () if given else (f"trainer.cpu_threads={threads_per_process(opts.nproc)}",)
            one_process = dataclasses.replace(opts, nproc=1, overrides=(*opts.overrides, *threads))
        code, single = _probe_once(one_process, steps, dry_run)
        if code != 0 or dry_run:
            return code
    code, report = _probe_once(opts, steps, dry_run)
    if code != 0 or dry_run:
        return code
    if scaling:
        from mgpucli.cli.probe_report import add_scaling

        add_scaling(report, single)
    render(report, as_json)
    return 0


def _scaling_refused(opts) -> None:
    """--probe-scaling compares 1 process with N on this machine: N must be 2 or more, and one node."""
    from mgpucli.errors import UsageError

    if (opts.nnodes or 1) > 1:
        raise UsageError("--probe-scaling measures on this machine: it does not run across nodes.",
                         "Drop --nnodes (or --probe-scaling).")
    if opts.cpu and (opts.nproc or 1) < 2:
        raise UsageError("--probe-scaling compares 1 process with N: give N with --nproc (2 or more).",
                         "Example: mgpu launch --cpu --nproc 2 quickstart --probe --probe-scaling.")


def _probe_once(opts, steps: int, dry_run: bool):
    """One probe launch: (its exit code, rank 0's report or None)."""
    import dataclasses
    import json
    import tempfile
    from pathlib import Path

    from mgpucli.launch.main import launch as run_launch

    with tempfile.TemporaryDirectory(prefix="mgpu-probe-") as tmp:
        result = Path(tmp) / "probe.json"
        overrides = [o for o in opts.overrides if o.lstrip("+").split("=", 1)[0].strip() != "run_dir"]
        probing = dataclasses.replace(opts, overrides=(*overrides, f"run_dir={Path(tmp) / 'run'}"),
                                      probe_steps=steps, probe_result=None if dry_run else str(result))
        code = run_launch(probing, dry_run=dry_run)
        if code != 0 or dry_run:
            return code, None
        return 0, json.loads(result.read_text())
