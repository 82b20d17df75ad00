"""The CLI shell: help and version are instant and never import torch, omegaconf or hydra."""

from __future__ import annotations

import re

import pytest

from mgpucli import __version__
from tests.procs import mgpu


@pytest.mark.parametrize("args", [["--help"], ["-h"], ["train", "--help"], []])
def test_help_without_torch(tmp_path, no_heavy_imports, args):
    r = mgpu(*args, cwd=tmp_path, env=no_heavy_imports, timeout=30)
    assert r.returncode in (0, 2) if not args else r.returncode == 0, r.output  # bare `mgpu` shows help
    assert "must not be imported" not in r.output
    assert "train" in r.output


def test_version_without_torch(tmp_path, no_heavy_imports):
    r = mgpu("--version", cwd=tmp_path, env=no_heavy_imports, timeout=30)
    assert r.returncode == 0 and r.stdout.strip() == f"mgpu {__version__}"


def test_unknown_command_is_usage_error(tmp_path):
    r = mgpu("fly", cwd=tmp_path, timeout=30)
    assert r.returncode == 2 and "No such command" in r.output and "Traceback" not in r.output


TYPE_LABELS = re.compile(r"<(bool|str|int|float|list\[\w+\])>|\{[a-z_]+\}")  # typer >= 0.27's help labels


@pytest.mark.parametrize("command", [[], ["train"], ["validate"], ["launch"], ["doctor"], ["recipes"],
                                     ["recipes", "show"], ["recipes", "copy"]])
def test_help_shows_plain_flags_and_named_values(tmp_path, command):
    r = mgpu(*command, "--help", cwd=tmp_path, env={"COLUMNS": "160", "TERM": "dumb"}, timeout=30)
    assert r.returncode == 0, r.output
    assert not TYPE_LABELS.search(r.output), r.output
    flag = re.search(r"--help\s+-h\s+(\S+)", r.output)
    assert flag and flag[1] == "Show", r.output  # nothing between the flag and its help


def test_launch_help_names_what_each_option_takes(tmp_path):
    r = mgpu("launch", "--help", cwd=tmp_path, env={"COLUMNS": "160", "TERM": "dumb"}, timeout=30)
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
