"""``mgpu train``: the worker. Runs alone, under torchrun, or under ``mgpu launch``."""

from __future__ import annotations

import sys

import typer

from mgpucli.errors import MgpuError


def train(
    recipe: str = typer.Argument(..., help="A recipe YAML file, or a shipped recipe's name (see `mgpu recipes`)."),
    overrides: list[str] | None = typer.Argument(
        None, help="Hydra overrides: key=value, +key=value (add), ~key (remove).", show_default=False
    ),
    resume: str | None = typer.Option(
        None, "--resume", help="Checkpoint to resume from, or 'auto' (the run dir's last.pt if any)."
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
    from mgpucli.console import print_error
    from mgpucli.dist.env import read_rank_env

    rank = None
    try:
        env = read_rank_env()
        rank = env.rank if env.distributed else None
        if check:
            from mgpucli.cli.check import check_and_print

            check_and_print(recipe, list(overrides or []), quiet=rank not in (None, 0))
            return
        _run(recipe, list(overrides or []), resume, overwrite, env)
    except MgpuError as err:
        # Bad input is the same on every rank: let rank 0 alone say it. A failure names its rank.
        if rank in (None, 0) or not err.same_on_every_rank:
            print_error(str(err), rank=rank)
        sys.exit(err.exit_code)
    except Exception:
        if rank is not None:
            print_error("failed with an unexpected error (traceback below).", rank=rank)
        raise


def _run(recipe, overrides, resume, overwrite, env) -> None:
    """Train. Unexpected exceptions go through torch's @record, which writes the error file (with the
    traceback) that torchrun's agent reports; an MgpuError is a message for the user, printed without one."""
    from torch.distributed.elastic.multiprocessing.errors import record

    from mgpucli.cli.progress import RichReporter
    from mgpucli.engine.run import run_training

    def guarded() -> MgpuError | None:
        try:
            run_training(recipe, overrides, resume=resume, overwrite=overwrite, env=env,
                         reporter=RichReporter() if env.rank == 0 else None)
        except MgpuError as err:
            return err
        return None

    err = record(guarded)()
    if err is not None:
        raise err
