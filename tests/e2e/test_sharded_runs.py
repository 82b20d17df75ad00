"""A ``trainer.checkpoint_format: sharded`` run (its latest checkpoint is ``checkpoints/last.dcp``, a directory):
stopped mid-way, ``mgpu doctor RUN_DIR`` names that checkpoint and its step; a restart continues from it.

Two CPU processes with gloo under FSDP, the charlm recipe made tiny. Every process carries a unique tag; each test
ends with none left.
"""

from __future__ import annotations

import json
import os
import re
import signal
import sys
from pathlib import Path

from mgpucli import proctree
from tests.e2e.test_preempted_postmortem import _env
from tests.inproc import cli
from tests.procs import RECIPES, mgpu, stop_tree, wait_until

CHARLM = str(RECIPES / "charlm.yaml")
TINY = ["vars.block_size=32", "model.d_model=32", "model.n_head=2", "+data.train.num_chars=12000",
        "+data.val.num_chars=6000", "data.batch_size=8", "trainer.log_every=2", "trainer.cpu_threads=1",
        "trainer.strategy=fsdp", "trainer.checkpoint_format=sharded", "trainer.checkpoint_every_steps=4"]
LAUNCH = ["--cpu", "--nproc", "2", CHARLM, *TINY]


def _stopped_mid_way(tmp_path: Path, tagged: str, run_dir: Path) -> tuple[int, str]:
    """A long sharded run, SIGTERMed once it has logged a training record; (exit code, output)."""
    err_path = tmp_path / "stopped.err"
    metrics = run_dir / "metrics.jsonl"
    with open(err_path, "w") as err:
        args = [*LAUNCH, "trainer.max_steps=100000", "trainer.epochs=1000", f"run_dir={run_dir}"]
        slow = {"MGPU_FAULT": "sleep", "MGPU_FAULT_SLEEP": "0.05"}  # every step: time to stop it mid-way
        proc = proctree.start([sys.executable, "-m", "mgpucli", "launch", *args], cwd=tmp_path, env=_env(tagged, slow),
                              stdout=err, stderr=err)
    try:
        def training() -> bool:
            assert proc.poll() is None, err_path.read_text()
            return metrics.is_file() and '"split": "train"' in metrics.read_text()

        assert wait_until(training, 120), f"training never started:\n{err_path.read_text()}"
        os.kill(proc.pid, signal.SIGTERM)
        code = proc.wait(timeout=60)  # torch's shutdown window is 30 s
    finally:
        stop_tree(proc)
    return code, err_path.read_text(errors="replace")


def test_a_stopped_sharded_run_is_diagnosed_and_its_restart_resumes_last_dcp(tmp_path: Path, tag: str):
    run_dir = tmp_path / "run"
    code, output = _stopped_mid_way(tmp_path, tag, run_dir)
    assert code == 75, output
    last = run_dir / "checkpoints" / "last.dcp"
    assert last.is_symlink() and not (run_dir / "checkpoints" / "last.pt").exists()
    step = json.loads((run_dir / "launch.json").read_text())["result"]["step"]

    human = cli("doctor", str(run_dir), cwd=tmp_path, env=_env(tag))  # reads the run dir: in this process
    assert human.returncode == 75, human.output
    assert f"continue from checkpoints/last.dcp (step {step})" in human.stderr, human.stderr
    report = json.loads(cli("doctor", str(run_dir), "--json", cwd=tmp_path, env=_env(tag)).stdout)
    assert report["checkpoint"] == str(last)
    assert (report["preempted"]["checkpoint_step"], report["preempted"]["checkpoint_complete"]) == (step, True)

    # Continued from the step directory it stopped in (an explicit --resume), with one restart allowed: the crash
    # comes after the next save, so the restart must continue from last.dcp, not from the path the user gave.
    given = str(run_dir / "checkpoints" / os.readlink(last))
    crash_at = step + 6
    env = _env(tag, {"MGPU_FAULT": f"crash@rank=1@step={crash_at}", "MGPU_FAULT_ONCE": str(tmp_path / "fired")})
    res = mgpu("launch", "--max-restarts", "1", *LAUNCH, f"trainer.max_steps={crash_at + 4}", f"run_dir={run_dir}",
               "--resume", given, cwd=tmp_path, env=env, timeout=240)
    assert res.returncode == 0, res.output
    assert (tmp_path / "fired").exists()  # the crash did happen
    restarted = sorted(run_dir.glob("logs/*/attempt_1/0/stderr.log"))[-1].read_text()
    resumed = re.search(r"resumed from (\S+) at step (\d+)", restarted)
    assert resumed and resumed.group(1).endswith("last.dcp") and int(resumed.group(2)) > step, restarted
