"""The CLI shell's help texts and messages, run in the test process (tests/inproc.py). That help and version never
import torch, omegaconf or hydra is shown by a fresh process: tests/e2e/test_cli.py."""

from __future__ import annotations

import re

import pytest

from tests.inproc import cli


def test_unknown_command_is_usage_error(tmp_path):
    r = cli("fly", cwd=tmp_path)
    assert r.returncode == 2 and "No such command" in r.output and "Traceback" not in r.output


TYPE_LABELS = re.compile(r"<(bool|str|int|float|list\[\w+\])>|\{[a-z_]+\}")  # typer >= 0.27's help labels


@pytest.mark.parametrize("command", [[], ["train"], ["validate"], ["launch"], ["doctor"], ["recipes"],
                                     ["recipes", "show"], ["recipes", "copy"], ["runs"],
                                     ["sweep"], ["convert"]])
def test_help_shows_plain_flags_and_named_values(tmp_path, command):
    r = cli(*command, "--help", cwd=tmp_path, env={"COLUMNS": "160", "TERM": "dumb"})
    assert r.returncode == 0, r.output
    assert not TYPE_LABELS.search(r.output), r.output
    flag = re.search(r"--help\s+-h\s+(\S+)", r.output)
    assert flag and flag[1] == "Show", r.output  # nothing between the flag and its help


def test_sweep_help_names_its_extra_as_pip_takes_it(tmp_path):
    r = cli("sweep", "--help", cwd=tmp_path, env={"COLUMNS": "300", "TERM": "dumb"})
    said = " ".join(r.stdout.replace("│", " ").split())  # the help's lines joined
    assert "pip install 'mgpu[sweep]'" in said, r.stdout  # not read as rich markup


def test_launch_help_names_what_each_option_takes(tmp_path):
    r = cli("launch", "--help", cwd=tmp_path, env={"COLUMNS": "160", "TERM": "dumb"})
    assert r.returncode == 0 and "<bool>" not in r.output, r.output
    usage = r"Usage: .*launch \[OPTIONS\] \[RECIPE\|SCRIPT\.py\]\s+\[OVERRIDES\|ARGS\]\.\.\."
    assert re.search(usage, r.output), r.output
    assert "mgpu's options go before the recipe or the script" in r.output
    for flag in ("--cpu", "--dry-run", "--overwrite", "--check", "--local-rank-arg"):
        assert re.search(rf"{flag}\s+(Run|Check|Passed|Pass)", r.output), (flag, r.output)
    for option, metavar in (("--gpus", "N|LIST|all"), ("--nproc", "N"), ("--master-port", "PORT"),
                            ("--resume", "PATH|auto"), ("--log-dir", "DIR"), ("-m", "MODULE"), ("--run-dir", "DIR"),
                            ("--show-rank", "N|all")):
        assert re.search(rf"{option}\s+{re.escape(metavar)}\s", r.output), (option, r.output)
