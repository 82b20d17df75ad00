"""``mgpu export RUN_DIR OUT_DIR``: a run's checkpoint as a Hugging Face Transformers model directory."""

from __future__ import annotations

import json
import sys
from dataclasses import asdict

import typer

from mgpucli.errors import MgpuError


def export(
    run_dir: str = typer.Argument(..., help="The run dir a recipe trained into, e.g. runs/NAME."),
    out_dir: str = typer.Argument(..., help="A new (or empty) directory for the model, its config and tokenizer."),
    checkpoint: str = typer.Option("last", "--checkpoint", metavar="last|best", help="Which checkpoint to export."),
    weights: str = typer.Option(
        "model", "--weights", metavar="model|ema",
        help="The model's weights, or their moving average (runs trained with trainer.ema)."
    ),
    trust_recipe: bool = typer.Option(
        False, "--trust-recipe", help="Allow _target_s outside mgpu's allowlist in the checkpoint's recipe."
    ),
    as_json: bool = typer.Option(False, "--json", help="Print one JSON object on stdout (and nothing else there)."),
) -> None:
    """Write a run's checkpoint as a Transformers model directory (save_pretrained, safetensors, the tokenizer)."""
    from mgpucli.console import print_error

    try:
        from mgpucli.engine.export import export as write

        done = write(run_dir, out_dir, which=checkpoint, weights=weights, trust_recipe=trust_recipe)
    except MgpuError as err:
        print_error(str(err))
        sys.exit(err.exit_code)
    if as_json:
        print(json.dumps(asdict(done)))
        return
    from mgpucli.console import err_console

    step = f" (step {done.step})" if done.step is not None else ""
    tokenizer = " and its tokenizer" if done.tokenizer else " (the recipe names no tokenizer)"
    err_console().print(f"exported {done.checkpoint}{step}{tokenizer} to {done.out_dir}: {', '.join(done.files)}\n"
                        f"load it with {done.load_with}")
