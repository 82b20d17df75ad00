"""benchmarks/children.py: a benchmark's process trees are gone when it ends, however it ends, including the
processes that (like torchrun's workers) run in sessions of their own."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from benchmarks.children import run_tree
from tests.procs import REPO, proc_state, stop_tree

# A launcher like torchrun: its worker runs in a session of its own (killing the launcher's group misses it).
LAUNCHER = r"""
import subprocess, sys, time
worker = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"], start_new_session=True)
open(sys.argv[1], "w").write(str(worker.pid))
print("started", flush=True)
time.sleep(120)
"""


def _alive(pid: int) -> bool:
    return proc_state(pid) not in (None, "Z")


def _wait_for(path: Path, timeout: float = 30.0) -> int:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if path.exists() and path.read_text():
            return int(path.read_text())
        time.sleep(0.05)
    raise AssertionError(f"{path} was not written within {timeout} s")


def _gone(pid: int, timeout: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout
    while _alive(pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    return not _alive(pid)


def test_a_finished_command_gives_its_status_and_output():
    rc, out, err = run_tree([sys.executable, "-c", "import sys; print('out'); print('err', file=sys.stderr); "
                             "sys.exit(3)"], dict(os.environ), timeout=60)
    assert (rc, out, err) == (3, "out\n", "err\n")


def test_after_its_time_limit_the_whole_tree_is_killed(tmp_path):
    pid_file = tmp_path / "worker.pid"
    t0 = time.monotonic()
    rc, out, err = run_tree([sys.executable, "-c", LAUNCHER, str(pid_file)], dict(os.environ), timeout=3)
    assert (rc, out, err) == (None, "", "")
    assert time.monotonic() - t0 < 30
    assert _gone(_wait_for(pid_file)), "the worker in its own session outlived the time limit"


def test_a_benchmark_stopped_with_sigterm_kills_the_tree_it_started(tmp_path):
    pid_file = tmp_path / "worker.pid"
    bench = (f"import os, sys\nsys.path.insert(0, {str(REPO)!r})\n"
             "from benchmarks.children import exit_on_sigterm, run_tree\n"
             "exit_on_sigterm()\n"
             f"run_tree([sys.executable, '-c', {LAUNCHER!r}, {str(pid_file)!r}], dict(os.environ), timeout=120)\n")
    proc = subprocess.Popen([sys.executable, "-c", bench], start_new_session=True)
    try:
        worker = _wait_for(pid_file)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 128 + signal.SIGTERM
        assert _gone(worker), "the worker in its own session outlived the stopped benchmark"
    finally:
        stop_tree(proc)
        if pid_file.exists() and pid_file.read_text() and _alive(int(pid_file.read_text())):
            os.kill(int(pid_file.read_text()), signal.SIGKILL)
