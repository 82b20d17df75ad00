"""``mgpu train``: the worker. Runs alone, under torchrun, or under ``mgpu launch``.

This file is the typer signature only; the command itself is :func:`mgpucli.cli.train_run.run_train`, which a
launched worker calls directly (mgpucli.launch.worker), without importing typer.
"""

from __future__ import annotations

import typer

# the fit probe's timed steps (also mgpu launch's option)
PROBE_STEPS_OPTION = typer.Option(20, "--probe-steps", metavar="N", help="Optimizer steps the probe times (after its "
                                  "warm-up).")


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
    probe: bool = typer.Option(
        False, "--probe", help="Will it fit? Build everything for real, time a few optimizer steps after a warm-up, "
        "print each rank's peak memory, step time, samples/s and the epoch's estimated time. Writes nothing."
    ),
    probe_steps: int = PROBE_STEPS_OPTION,
    as_json: bool = typer.Option(False, "--json", help="With --probe: print one JSON object on stdout."),
    probe_result: str | None = typer.Option(None, "--probe-result", hidden=True),
) -> None:
    """Train from a recipe on this process (one worker of a job when RANK/WORLD_SIZE are set)."""
    from mgpucli.cli.train_run import ProbeOptions, run_train

    if as_json and not probe:
        from mgpucli.console import print_error

        print_error("--json is the probe's report format: use it with --probe (training writes metrics.jsonl).")
        raise typer.Exit(2)
    asked = ProbeOptions(steps=probe_steps, as_json=as_json, result_file=probe_result) if probe else None
    run_train(recipe, list(overrides or []), resume, overwrite, check, probe=asked)
