"""``mgpu train``: the worker. Runs alone, under torchrun, or under ``mgpu launch``.

This file is the typer signature only; the command itself is :func:`mgpucli.cli.train_run.run_train`, which a
launched worker calls directly (mgpucli.launch.worker), without importing typer.
"""

from __future__ import annotations

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
    from mgpucli.cli.train_run import run_train

    run_train(recipe, list(overrides or []), resume, overwrite, check)
