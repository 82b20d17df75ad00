"""The launcher's verdict and its workers' wait for it (mgpucli/launch/gate.py), with real processes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

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
        path.write_text(json.dumps({"verdict": word}))
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
        assert passed.refused() is None and json.loads(Path(passed.path).read_text()) == {"verdict": gate.GO}

        def bad() -> None:
            raise ValueError("no")

        refused.check(bad, lambda: said.append("go?"), lambda: said.append("killed"))
        refused.start()
        assert isinstance(refused.refused(), ValueError)
        assert json.loads(Path(refused.path).read_text()) == {"verdict": gate.REFUSED}
    finally:
        passed.close()
        refused.close()
    assert said == ["go", "killed"] and not os.path.exists(os.path.dirname(passed.path))


@pytest.mark.parametrize("handed_over", [True, False], ids=["the launcher's recipe", "composed by the worker"])
def test_local_rank_0_reports_the_components_problems_to_the_launcher(tmp_path, monkeypatch, handed_over):
    from mgpucli.config import handoff, load_recipe
    from mgpucli.errors import RecipeError

    overrides = ["optim.momentum=-1", "trainer.device=cpu"]
    monkeypatch.delenv(handoff.ENV, raising=False)
    if handed_over:
        monkeypatch.setenv(handoff.ENV, str(handoff.write(load_recipe("quickstart", overrides), "quickstart",
                                                          overrides, tmp_path)))
    g = gate.Gate()
    try:
        env = {gate.ENV: g.path, "MGPU_LAUNCH_PID": str(os.getppid()), "LOCAL_RANK": "1"}
        gate.check_builds_here("quickstart", overrides, env)  # not local rank 0: built (the imports), not reported
        assert not os.path.exists(os.path.join(os.path.dirname(g.path), "builds.json"))
        gate.check_builds_here("quickstart", overrides, {**env, "LOCAL_RANK": "0"})
        with pytest.raises(RecipeError) as err:
            g.builds_checked("quickstart")
    finally:
        g.close()
    assert len(err.value.problems) == 1 and "MGPU_DEBUG=1" in (err.value.hint or "")
    assert err.value.problems[0].startswith("optim: building torch.optim.SGD failed: ValueError: Invalid momentum "
                                            "value: -1")
