"""``mgpu train``: train a recipe on this process. Runs alone, or as one worker under plain torchrun.

The training itself is :func:`mgpucli.engine.train_entry.train_recipe`, which ``mgpu launch``'s workers call
without this CLI (:mod:`mgpucli.launch.worker`). Here: the options, ``--check``, and rank 0's progress bar on a
terminal.
"""

from __future__ import annotations

import sys

import typer


def train(
    recipe: str = typer.Argument(..., help="A recipe YAML file, or a shipped recipe's name (see `mgpu recipes`)."),
    overrides: list[str] | None = typer.Argument(
        None, help="Hydra overrides: key=value, +key=value (add), ~key (remove).", show_default=False
    ),
    resume: str | None = typer.Option(
        None, "--resume", metavar="PATH|auto",
        help="Checkpoint to resume from, or 'auto' (the run dir's last.pt if any)."
    ),
    overwrite: bool = typer.Option(
        False, "--overwrite", help="Start afresh in a run dir that already holds checkpoints (deletes them)."
    ),
    check: bool = typer.Option(
        False, "--check", help="Check the whole recipe (schema, every _target_, the datasets), print it resolved, "
        "exit. Trains nothing, writes nothing."
    ),
) -> None:
    """Train from a recipe on this process (one worker of a job when RANK/WORLD_SIZE are set)."""
    from mgpucli.engine import train_entry

    overrides = list(overrides or [])
    if check:
        from mgpucli.cli.check import check_and_print
        from mgpucli.run_files import check_start

        train_entry.run_as_rank(lambda env: check_and_print(
            recipe, overrides, quiet=env.distributed and env.rank != 0,
            check_run_dir=lambda run_dir, sharded: check_start(run_dir, resume, overwrite, sharded)))
        return
    train_entry.train_recipe(recipe, overrides, resume=resume, overwrite=overwrite, rank0_reporter=rank0_reporter)


def rank0_reporter():
    """Rank 0's report: a rich progress bar on a terminal, plain lines otherwise (log files, CI, pipes)."""
    if sys.stderr.isatty():
        from mgpucli.cli.progress import RichReporter

        return RichReporter()
    from mgpucli.engine.line_reporter import LineReporter

    return LineReporter()
