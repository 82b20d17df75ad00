"""``mgpu train``: train a recipe on this process. Runs alone, or as one worker under plain torchrun.

The training itself is :func:`mgpucli.engine.train_entry.train_recipe`, which ``mgpu launch``'s workers call
without this CLI (:mod:`mgpucli.launch.worker`). Here: the options, ``--check``, and rank 0's progress bar on a
terminal.
"""

from __future__ import annotations

import sys

import typer

from mgpucli.run_layout import LAST_FULL, LAST_SHARDED, METRICS

# the fit probe's timed steps (also mgpu launch's option)
PROBE_STEPS = 20
PROBE_STEPS_OPTION = typer.Option(None, "--probe-steps", metavar="N", show_default=False,
                                  help=f"With --probe: the optimizer steps it times, after its warm-up (default "
                                  f"{PROBE_STEPS}).")
PROBE_ONLY = (f"--json is the probe's report format: use it with --probe (training writes {METRICS}).",
              "--probe-steps sets how many steps the probe times: use it with --probe.")


def probe_only_problem(probe: bool, as_json: bool, probe_steps: int | None) -> str | None:
    """--json and --probe-steps without --probe would be ignored: the message that refuses them, or None."""
    if probe:
        return None
    return PROBE_ONLY[0] if as_json else PROBE_ONLY[1] if probe_steps is not None else None


def train(
    recipe: str = typer.Argument(..., help="A recipe YAML file, or a shipped recipe's name (see `mgpu recipes`)."),
    overrides: list[str] | None = typer.Argument(
        None, help="Hydra overrides: key=value, +key=value (add), ~key (remove).", show_default=False
    ),
    resume: str | None = typer.Option(
        None, "--resume", metavar="PATH|auto",
        help=f"Checkpoint to resume from, or 'auto' (the run dir's {LAST_FULL} or {LAST_SHARDED} if any)."
    ),
    overwrite: bool = typer.Option(
        False, "--overwrite", help="Start afresh in a run dir that already holds checkpoints (deletes them)."
    ),
    check: bool = typer.Option(
        False, "--check", help="Check the whole recipe (schema, every _target_, the datasets), print it resolved, "
        "exit. Trains nothing, writes nothing."
    ),
    probe: bool = typer.Option(
        False, "--probe", help="Will it fit? Build everything for real, time a few optimizer steps after a warm-up, "
        "print each rank's peak memory, step time, samples/s and the epoch's estimated time. Writes nothing."
    ),
    probe_steps: int | None = PROBE_STEPS_OPTION,
    as_json: bool = typer.Option(False, "--json", help="With --probe: print one JSON object on stdout."),
    probe_result: str | None = typer.Option(None, "--probe-result", hidden=True),
) -> None:
    """Train from a recipe on this process (one worker of a job when RANK/WORLD_SIZE are set)."""
    from mgpucli.engine import train_entry

    overrides = list(overrides or [])
    if probe:
        _probe(recipe, overrides, PROBE_STEPS if probe_steps is None else probe_steps, as_json, probe_result,
               resume=resume, overwrite=overwrite, check=check)
        return
    unused = probe_only_problem(probe, as_json, probe_steps)
    if unused:
        from mgpucli.console import print_error

        print_error(unused)
        raise typer.Exit(2)
    if check:
        from mgpucli.cli.check import check_and_print
        from mgpucli.run_files import check_start

        train_entry.run_as_rank(lambda env: check_and_print(
            recipe, overrides, quiet=env.distributed and env.rank != 0,
            check_run_dir=lambda run_dir, sharded: check_start(run_dir, resume, overwrite, sharded),
            world_size=env.world_size))
        return
    train_entry.train_recipe(recipe, overrides, resume=resume, overwrite=overwrite, rank0_reporter=rank0_reporter)


def rank0_reporter():
    """Rank 0's report: a rich progress bar on a terminal, plain lines otherwise (log files, CI, pipes)."""
    if sys.stderr.isatty():
        from mgpucli.cli.progress import RichReporter

        return RichReporter()
    from mgpucli.engine.line_reporter import LineReporter

    return LineReporter()


def _probe(recipe: str, overrides: list[str], steps: int, as_json: bool, result_file: str | None, *,
           resume: str | None, overwrite: bool, check: bool) -> None:
    """``--probe``: measure (engine/probe.py); rank 0 renders the report, or writes it to ``result_file``."""
    from mgpucli.engine import train_entry
    from mgpucli.errors import UsageError

    clash = "--check" if check else "--resume" if resume else "--overwrite" if overwrite else None
    if clash:
        def refuse(env) -> None:  # exit 2, said once (by rank 0 under torchrun)
            raise UsageError(f"--probe and {clash} don't combine: the probe measures a fresh start and writes "
                             "nothing, no checkpoint read and no run dir taken.", f"Drop {clash} (or --probe).")

        train_entry.run_as_rank(refuse)
    report = train_entry.probe_recipe(recipe, overrides, steps=steps, result_file=result_file,
                                      rank0_reporter=rank0_reporter)
    if report is not None and not result_file:
        from mgpucli.cli.probe_report import render

        render(report, as_json)
