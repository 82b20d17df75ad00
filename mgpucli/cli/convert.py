"""``mgpu convert CHECKPOINT OUT``: a sharded checkpoint as one full checkpoint file."""

from __future__ import annotations

import json
import sys
from dataclasses import asdict

import typer

from mgpucli.errors import MgpuError
from mgpucli.run_layout import CHECKPOINTS, LAST_FULL, LAST_SHARDED


def convert(
    checkpoint: str = typer.Argument(..., help=f"A sharded checkpoint, e.g. runs/NAME/{CHECKPOINTS}/{LAST_SHARDED}."),
    out: str = typer.Argument(..., help=f"The file to write, e.g. {LAST_FULL} (a new file)."),
    as_json: bool = typer.Option(False, "--json", help="Print one JSON object on stdout (and nothing else there)."),
) -> None:
    """Write a sharded checkpoint as one checkpoint file (what trainer.checkpoint_format=full writes)."""
    from mgpucli.console import print_error

    try:
        from mgpucli.engine.convert import convert as write

        done = write(checkpoint, out)
    except MgpuError as err:
        print_error(str(err))
        sys.exit(err.exit_code)
    if as_json:
        print(json.dumps(asdict(done)))
        return
    from mgpucli.console import err_console

    step = f" (step {done.step})" if done.step is not None else ""
    err_console().print(f"wrote {done.checkpoint}{step} as one file: {done.out} ({done.bytes / 2**20:.1f} MiB)",
                        markup=False, highlight=False)
