"""``mgpu launch``: start one training worker per GPU (or N on CPUs) through torch's launcher engine."""

from __future__ import annotations

import sys

import typer

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
        code = run_launch(opts, dry_run=dry_run)
    except MgpuError as err:
        print_error(str(err))
        sys.exit(err.exit_code)
    except KeyboardInterrupt:
        print_error("interrupted before any worker started.")
        sys.exit(130)
    sys.exit(code)
