"""``mgpu launch``: start one training worker per GPU (or N on CPUs) through torch's launcher engine."""

from __future__ import annotations

import sys

import typer

from mgpucli.cli.train import PROBE_STEPS_OPTION
from mgpucli.errors import MgpuError


def launch(
    recipe: str = typer.Argument(..., help="A recipe YAML file, or a shipped recipe's name (see `mgpu recipes`)."),
    overrides: list[str] | None = typer.Argument(
        None, help="Hydra overrides for every worker: key=value, +key=value, ~key.", show_default=False
    ),
    gpus: str | None = typer.Option(
        None, "--gpus", metavar="N|LIST|all",
        help="GPUs to use: a count (first N visible), a list (0,2,3; one GPU: 1,) or 'all' "
        "(default: all visible).", show_default=False,
    ),
    cpu: bool = typer.Option(False, "--cpu", help="Run on CPUs with gloo (sets trainer.device=cpu)."),
    nproc: int | None = typer.Option(
        None, "--nproc", metavar="N", help="Number of CPU processes (with --cpu; default 1)."
    ),
    nnodes: int | None = typer.Option(
        None, "--nnodes", metavar="N", help="Number of nodes (default 1, or from SLURM)."
    ),
    node_rank: int | None = typer.Option(
        None, "--node-rank", metavar="RANK",
        help="This node's rank, 0..nnodes-1 (static rendezvous; default from SLURM)."
    ),
    master_addr: str | None = typer.Option(
        None, "--master-addr", metavar="HOST",
        help="Address of node 0, where the rendezvous store listens (multi-node)."
    ),
    master_port: int | None = typer.Option(
        None, "--master-port", metavar="PORT",
        help="Port of the rendezvous store; checked to be free before anything starts."
    ),
    rdzv_endpoint: str | None = typer.Option(
        None, "--rdzv-endpoint", metavar="HOST:PORT",
        help="HOST:PORT of a c10d rendezvous (multi-node alternative to --master-addr)."
    ),
    rdzv_id: str | None = typer.Option(
        None, "--rdzv-id", metavar="ID", help="Rendezvous id; the same on every node (default: derived from the job)."
    ),
    max_restarts: int = typer.Option(
        0, "--max-restarts", metavar="K",
        help="Restart a failed worker group up to K times, resuming from the last checkpoint."
    ),
    log_dir: str | None = typer.Option(
        None, "--log-dir", metavar="DIR",
        help="Where every rank's stdout/stderr go (default: RUN_DIR/logs).", show_default=False
    ),
    dry_run: bool = typer.Option(False, "--dry-run", help="Check everything, print the torchrun command, exit."),
    resume: str | None = typer.Option(
        None, "--resume", metavar="PATH|auto",
        help="Passed to every worker: a checkpoint, or 'auto' (the run's last.pt if any)."
    ),
    overwrite: bool = typer.Option(
        False, "--overwrite", help="Passed to every worker: start afresh in a run dir that holds checkpoints."
    ),
    check: bool = typer.Option(
        False, "--check", help="Check the workers' recipe in full (schema, every _target_, the datasets), print it "
        "resolved, exit. No devices needed, nothing started or written."
    ),
    probe: bool = typer.Option(
        False, "--probe", help="Will it fit? Every worker builds everything and times a few optimizer steps "
        "(mgpu train --probe); the report gathers every rank. No checkpoint written, the run dir left alone."
    ),
    probe_steps: int = PROBE_STEPS_OPTION,
    as_json: bool = typer.Option(False, "--json", help="With --probe: print the report as one JSON object on stdout."),
) -> None:
    """Train a recipe on all visible GPUs (or --gpus, or --cpu --nproc N) with one worker process each."""
    from mgpucli.console import print_error
    from mgpucli.launch.main import launch as run_launch
    from mgpucli.launch.plan import LaunchOptions

    opts = LaunchOptions(
        recipe=recipe, overrides=tuple(overrides or ()), gpus=gpus, cpu=cpu, nproc=nproc, nnodes=nnodes,
        node_rank=node_rank, master_addr=master_addr, master_port=master_port, rdzv_endpoint=rdzv_endpoint,
        rdzv_id=rdzv_id, max_restarts=max_restarts, log_dir=log_dir, resume=resume, overwrite=overwrite,
    )
    try:
        if check:  # the recipe as every worker gets it (with --cpu's override); no devices or processes needed
            from mgpucli.cli.check import check_and_print
            from mgpucli.launch.main import check_run_dir
            from mgpucli.launch.plan import worker_overrides

            check_and_print(recipe, worker_overrides(opts),
                            check_run_dir=lambda run_dir, sharded: check_run_dir(run_dir, opts, sharded))
            sys.exit(0)
        if as_json and not probe:
            from mgpucli.errors import UsageError

            raise UsageError("--json is the probe's report format: use it with --probe.")
        code = _probe(opts, probe_steps, as_json, dry_run) if probe else run_launch(opts, dry_run=dry_run)
    except MgpuError as err:
        print_error(str(err))
        sys.exit(err.exit_code)
    except KeyboardInterrupt:
        print_error("interrupted before any worker started.")
        sys.exit(130)
    sys.exit(code)


def _probe(opts, steps: int, as_json: bool, dry_run: bool) -> int:
    """``--probe``: the workers run ``mgpu train --probe`` in a temporary run dir (the recipe's own, and any
    checkpoints in it, stay untouched, and are no reason to refuse the launch); rank 0's report comes back through
    a file and is rendered here."""
    import dataclasses
    import json
    import tempfile
    from pathlib import Path

    from mgpucli.errors import UsageError
    from mgpucli.launch.main import launch as run_launch

    clash = "--resume" if opts.resume else "--overwrite" if opts.overwrite else \
        "--max-restarts" if opts.max_restarts else None
    if clash:
        raise UsageError(f"--probe and {clash} don't combine: the probe measures a fresh start and writes nothing.",
                         f"Drop {clash} (or --probe).")
    if steps < 1:
        raise UsageError(f"--probe-steps {steps}: the probe needs at least one step to time.")
    with tempfile.TemporaryDirectory(prefix="mgpu-probe-") as tmp:
        result = Path(tmp) / "probe.json"
        overrides = [o for o in opts.overrides if o.lstrip("+").split("=", 1)[0].strip() != "run_dir"]
        probing = dataclasses.replace(opts, overrides=(*overrides, f"run_dir={Path(tmp) / 'run'}"),
                                      probe_steps=steps, probe_result=None if dry_run else str(result))
        code = run_launch(probing, dry_run=dry_run)
        if code != 0 or dry_run:
            return code
        from mgpucli.cli.probe_report import render

        render(json.loads(result.read_text()), as_json)
    return 0
