"""benchmarks/jobs.py: a benchmark's jobs are gone when it ends, however it ends (a time limit, SIGTERM, Ctrl-C),
including processes in sessions of their own as torchrun's workers are; and each rank's peak memory is its
worker's, not its children's."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from benchmarks.jobs import run
from tests.procs import REPO, proc_state, stop_tree

# A launcher like torchrun: its worker (RANK=0) runs in a session of its own, so killing the launcher's group
# misses it; the worker holds 60 MiB and starts a child of its own (a data loader process) that holds 200 MiB.
LAUNCHER = r"""
import os, subprocess, sys, time
child = f"import time; b = b'x' * (200 * 2**20); time.sleep({sys.argv[2]})"
code = (f"import subprocess, sys, time; a = b'x' * (60 * 2**20); subprocess.Popen([sys.executable, '-c', {child!r}]); "
        f"time.sleep({sys.argv[2]})")
worker = subprocess.Popen([sys.executable, "-c", code], env={**os.environ, "RANK": "0"},
                          start_new_session=True)
open(sys.argv[1] + ".pid", "w").write(str(worker.pid))
worker.wait()
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


def test_a_finished_job_gives_its_status_output_and_each_ranks_worker_peak_memory(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "RANK"}
    done = run([sys.executable, "-c", LAUNCHER, str(tmp_path / "w"), "2"], env, 60, tmp_path / "log")
    assert done.rc is not None and list(done.peak_rss_mib) == [0]
    assert 60 <= done.peak_rss_mib[0] < 200  # the worker's, not its 200 MiB child's
    assert (tmp_path / "log").read_text().startswith("$ ")


def test_after_its_time_limit_the_whole_tree_is_killed(tmp_path):
    t0 = time.monotonic()
    done = run([sys.executable, "-c", LAUNCHER, str(tmp_path / "w"), "120"], dict(os.environ), 3, tmp_path / "log")
    assert done.rc is None and time.monotonic() - t0 < 30
    assert _gone(_wait_for(tmp_path / "w.pid")), "the worker in its own session outlived the time limit"


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_a_benchmark_stopped_by_sigterm_or_ctrl_c_kills_the_jobs_it_started(tmp_path, signum):
    bench = (f"import os, sys\nsys.path.insert(0, {str(REPO)!r})\n"
             "from pathlib import Path\n"
             "from benchmarks.jobs import run, run_main\n"
             f"run_main(lambda: run([sys.executable, '-c', {LAUNCHER!r}, {str(tmp_path / 'w')!r}, '120'], "
             f"dict(os.environ), 120, Path({str(tmp_path / 'log')!r})).rc)\n")
    proc = subprocess.Popen([sys.executable, "-c", bench], start_new_session=True, stderr=subprocess.PIPE, text=True)
    worker = None
    try:
        worker = _wait_for(tmp_path / "w.pid")
        proc.send_signal(signum)
        assert proc.wait(timeout=30) == 128 + signum  # 143 for SIGTERM, 130 for Ctrl-C
        assert _gone(worker), "the worker in its own session outlived the stopped benchmark"
        assert "Traceback" not in proc.stderr.read()
    finally:
        stop_tree(proc)
        if worker and _alive(worker):
            os.kill(worker, signal.SIGKILL)
