"""The ``mgpu`` entry point. This file only registers commands; heavy imports live inside the commands.

``mgpu --help`` and ``mgpu --version`` must never import torch, omegaconf or hydra.
"""

from __future__ import annotations

import sys

import typer

from mgpucli import __version__
from mgpucli.cli import convert as convert_cmd
from mgpucli.cli import doctor as doctor_cmd
from mgpucli.cli import export as export_cmd
from mgpucli.cli import launch as launch_cmd
from mgpucli.cli import recipes as recipes_cmd
from mgpucli.cli import runs as runs_cmd
from mgpucli.cli import sweep as sweep_cmd
from mgpucli.cli import train as train_cmd
from mgpucli.cli import validate as validate_cmd
from mgpucli.errors import MgpuError

app = typer.Typer(
    name="mgpu",
    help="Single-machine multi-GPU PyTorch training that is correct by default.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    context_settings={"help_option_names": ["-h", "--help"]},
)


def _version(value: bool) -> None:
    if value:
        print(f"mgpu {__version__}")
        raise typer.Exit()


@app.callback()
def root(
    version: bool = typer.Option(
        False, "--version", callback=_version, is_eager=True, help="Print mgpu's version and exit."
    ),
    local_rank: int | None = typer.Option(
        None,
        "--local-rank",
        "--local_rank",
        hidden=True,
        help="Passed by the legacy `python -m torch.distributed.launch`; LOCAL_RANK wins where set.",
    ),
) -> None:
    """Single-machine multi-GPU PyTorch training that is correct by default."""
    if local_rank is not None:
        from mgpucli.distributed.env import set_legacy_local_rank

        set_legacy_local_rank(local_rank)


app.command("train", context_settings={"allow_extra_args": False})(train_cmd.train)
app.command("validate")(validate_cmd.validate)
app.command("launch", context_settings={"allow_extra_args": False})(launch_cmd.launch)
app.command("doctor")(doctor_cmd.doctor)
app.command("export")(export_cmd.export)
app.command("convert")(convert_cmd.convert)
app.command("sweep")(sweep_cmd.sweep)
app.command("runs")(runs_cmd.runs)
app.add_typer(recipes_cmd.app, name="recipes")


def main() -> None:
    """Console-script entry: run the app, print MgpuErrors without a traceback. ``mgpu launch ... SCRIPT.py ARGS``:
    ARGS are kept from the CLI's parser and handed to the command untouched (:mod:`mgpucli.cli.launch_argv`)."""
    args = sys.argv[1:]
    obj = None
    if "launch" in args:
        from mgpucli.cli.launch_argv import split_script_args

        args, script_args = split_script_args(args, typer.main.get_command(app))
        obj = launch_cmd.ScriptArgs(script_args)
    try:
        app(args=args, obj=obj)
    except MgpuError as err:  # raised outside a command's own handler (rare)
        from mgpucli.console import print_error

        print_error(str(err))
        sys.exit(err.exit_code)
