"""tests/inproc.py: ``mgpu`` run in the test process reads like the console script, and refuses to start a process."""

from __future__ import annotations

import os
import signal
import sys

import pytest

from tests.inproc import ProcessStarted, cli
from tests.procs import assert_usage_error


def test_a_refusal_reads_as_the_console_script_prints_it(tmp_path):
    r = cli("train", "quickstart", "trainer.epcohs=2", cwd=tmp_path)
    assert_usage_error(r, "trainer.epcohs: unknown key (did you mean 'trainer.epochs'?)")
    assert r.stdout == "" and list(tmp_path.iterdir()) == []


def test_the_help_names_the_program_as_python_dash_m_does(tmp_path):
    r = cli("--help", cwd=tmp_path)
    assert r.returncode == 0 and "Usage: python -m mgpucli [OPTIONS] COMMAND" in r.stdout, r.output


def test_the_process_is_put_back_as_it_was(tmp_path):
    before = dict(os.environ), os.getcwd(), signal.getsignal(signal.SIGTERM), list(sys.path)
    r = cli("launch", "--cpu", "--nproc", "2", "quickstart", "--dry-run", cwd=tmp_path, env={"MGPU_TEST_X": "1"})
    assert r.returncode == 0 and "torchrun --nnodes 1 --nproc-per-node 2" in r.stdout, r.output
    assert (dict(os.environ), os.getcwd(), signal.getsignal(signal.SIGTERM), list(sys.path)) == before
    assert str(tmp_path) not in sys.path  # the launch put its working directory first, for its own components


def test_a_command_that_starts_a_process_fails_the_test(tmp_path):
    """mgpu doctor probes torch in a child process: a test of it belongs in tests/e2e."""
    with pytest.raises(ProcessStarted, match="started a process"):
        cli("doctor", "--timeout", "5", cwd=tmp_path)
