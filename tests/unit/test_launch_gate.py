"""The launcher's verdict and its workers' wait for it (mgpucli/launch/gate.py), with real processes."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

from mgpucli.launch import gate

WORKER = "from mgpucli.launch.gate import wait_for_verdict; wait_for_verdict(); print('went', flush=True)"


def _worker(verdict: Path, launcher_pid: int) -> subprocess.Popen:
    env = {**os.environ, gate.ENV: str(verdict), "MGPU_LAUNCH_PID": str(launcher_pid)}
    return subprocess.Popen([sys.executable, "-c", WORKER], env=env, stdout=subprocess.PIPE, text=True)


def _verdict(tmp_path: Path, word: str) -> tuple[int, str]:
    path = tmp_path / "verdict"
    proc = _worker(path, os.getpid())  # this process is the worker's parent: its launcher
    try:
        time.sleep(0.5)
        assert proc.poll() is None  # waiting for the verdict
        path.write_text(word)
        out, _ = proc.communicate(timeout=60)
    finally:
        proc.kill()
        proc.wait()
    return proc.returncode, out


def test_a_worker_goes_on_at_go(tmp_path):
    assert _verdict(tmp_path, gate.GO) == (0, "went\n")


def test_a_refused_launch_ends_its_worker_with_exit_2_and_nothing_said(tmp_path):
    assert _verdict(tmp_path, gate.REFUSED) == (2, "")


def test_a_stray_variable_holds_up_no_process_whose_parent_is_no_launcher(tmp_path):
    proc = _worker(tmp_path / "never-written", launcher_pid=1)
    out, _ = proc.communicate(timeout=60)
    assert (proc.returncode, out) == (0, "went\n")


def test_a_refusal_removes_what_the_launch_created_and_only_that(tmp_path):
    (tmp_path / "runs" / "old" / "logs").mkdir(parents=True)
    (tmp_path / "runs" / "old" / "logs" / "earlier.log").write_text("kept")
    g = gate.Gate()
    try:
        g.note(str(tmp_path / "runs" / "new" / "deep"))  # none of it exists: runs/new goes
        g.note(str(tmp_path / "runs" / "old" / "logs"))  # exists: only what comes into it goes
        (tmp_path / "runs" / "new" / "deep" / "logs").mkdir(parents=True)
        (tmp_path / "runs" / "old" / "logs" / "job_1" / "attempt_0").mkdir(parents=True)
        (tmp_path / "runs" / "old" / "logs" / "checked.json").write_text("{}")
        g.remove_created()
    finally:
        g.close()
    assert sorted(p.name for p in (tmp_path / "runs").iterdir()) == ["old"]
    assert [p.name for p in (tmp_path / "runs" / "old" / "logs").iterdir()] == ["earlier.log"]


def test_the_check_gives_its_verdict_and_its_error(tmp_path):
    said = []
    passed, refused = gate.Gate(), gate.Gate()
    try:
        passed.check(lambda: None, lambda: said.append("go"), lambda: said.append("killed"))
        passed.start()
        assert passed.refused() is None and Path(passed.path).read_text() == gate.GO

        def bad() -> None:
            raise ValueError("no")

        refused.check(bad, lambda: said.append("go?"), lambda: said.append("killed"))
        refused.start()
        assert isinstance(refused.refused(), ValueError) and Path(refused.path).read_text() == gate.REFUSED
    finally:
        passed.close()
        refused.close()
    assert said == ["go", "killed"] and not os.path.exists(os.path.dirname(passed.path))
