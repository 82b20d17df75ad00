"""``mgpu launch``'s command line split before the CLI parses it: mgpu's options, then a script and its untouched
arguments (pure: the real command's options, no processes)."""

from __future__ import annotations

import pytest
import typer

from mgpucli.cli.app import app
from mgpucli.cli.launch_argv import option_arities, split_script_args

GROUP = typer.main.get_command(app)


def split(line: str):
    return split_script_args(line.split(), GROUP)


@pytest.mark.parametrize("line, cli, script_args", [
    # everything after the script is the script's, mgpu's options included
    ("launch --cpu --nproc 2 main.py --epochs 10 --cpu --nproc 9",
     "launch --cpu --nproc 2 main.py", ("--epochs", "10", "--cpu", "--nproc", "9")),
    ("launch main.py", "launch main.py", ()),
    ("launch main.py --help", "launch main.py", ("--help",)),
    # a value of an option that looks like a script is the option's
    ("launch --log-dir x.py main.py a", "launch --log-dir x.py main.py", ("a",)),
    ("launch --log-dir=x.py --run-dir runs/a.py main.py a", "launch --log-dir=x.py --run-dir runs/a.py main.py",
     ("a",)),
    ("launch --show-rank all --gpus 0,2 main.py", "launch --show-rank all --gpus 0,2 main.py", ()),
    # a module, as python -m takes it
    ("launch --gpus 0,2 -m mypkg.train --config a.yaml -m x", "launch --gpus 0,2 -m mypkg.train",
     ("--config", "a.yaml", "-m", "x")),
    ("launch -mmypkg.train --lr 1", "launch -mmypkg.train", ("--lr", "1")),
    # -- ends mgpu's options; after the script it is the script's own
    ("launch --cpu -- main.py --x", "launch --cpu -- main.py", ("--x",)),
    ("launch main.py -- --x", "launch main.py", ("--", "--x")),
    # options of the root command before `launch`
    ("--local-rank=0 launch main.py a", "--local-rank=0 launch main.py", ("a",)),
    ("--local-rank 0 launch main.py a", "--local-rank 0 launch main.py", ("a",)),
])
def test_a_script_line_is_split_after_the_script(line: str, cli: str, script_args: tuple[str, ...]):
    assert split(line) == (cli.split(), script_args)


@pytest.mark.parametrize("line", [
    "launch --cpu --nproc 2 quickstart --resume auto",  # a recipe keeps options after it
    "launch --cpu quickstart main.py",  # a recipe first: the rest are overrides, as click sees them
    "launch recipes/x.yaml trainer.epochs=1",
    "launch --help",
    "launch",
    "launch -m",  # click says what is missing
    "launch --cpu -- quickstart a=1",
    "train main.py",  # not launch
    "recipes show main.py",
])
def test_anything_else_is_left_to_the_cli(line: str):
    assert split(line) == (line.split(), None)


def test_arities_come_from_the_command_itself():
    arities = option_arities(GROUP.commands["launch"])
    assert arities["--gpus"] == 1 and arities["--log-dir"] == 1 and arities["-m"] == 1
    assert arities["--cpu"] == 0 and arities["--dry-run"] == 0 and arities["--local-rank-arg"] == 0
    assert option_arities(GROUP)["--local-rank"] == 1 and option_arities(GROUP)["--version"] == 0
