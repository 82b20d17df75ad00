"""Fault injection end to end (real processes, gloo): whatever happens, the job stops promptly with a clear
reason and the last checkpoint is whole and resumable. Every test is bounded and leaves no process."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from mgpucli import proctree
from tests.procs import RECIPES, environ_of, group_alive, load_ckpt, mgpu, proc_state, stop_tree, torchrun, wait_until

QUICK = str(RECIPES / "quickstart.yaml")
SMALL = ["data.train.num_samples=1024", "data.val.num_samples=101", "trainer.log_every=4", "trainer.cpu_threads=1"]


def same_weights(a, b) -> bool:
    return all(torch.equal(a["model"][k], b["model"][k]) for k in a["model"])


def test_collective_timeout_names_the_late_rank(tmp_path):
    # Rank 1 is held inside step 3 until a stop signal (torchrun's, once rank 0 failed) or 300 s: it never arrives
    # at the all-reduce, so rank 0's 5 s timeout is what ends the job; held rather than asleep, rank 1 leaves when
    # torchrun stops it instead of making torchrun wait out its 30 s grace.
    start = time.monotonic()
    r = torchrun(2, "train", QUICK, *SMALL, "trainer.timeout_s=5", cwd=tmp_path,
                 env={"MGPU_FAULT": "hold_step@rank=1@step=3", "MGPU_FAULT_SLEEP": "300"}, timeout=240)
    elapsed = time.monotonic() - start
    assert r.returncode != 0
    assert "rank 0: a collective timed out after trainer.timeout_s=5 s" in r.stderr, r.stderr
    assert "'backward (gradient all-reduce)' at step 3" in r.stderr
    assert "Ranks that had not arrived: rank 1 (last seen at step 3 in 'forward'" in r.stderr
    assert "raise trainer.timeout_s" in r.stderr
    # The timeout ended it, not rank 1's 300 s hold: a generous bound (5 s timeout + torch's 30 s teardown window +
    # start-up, which a loaded 2-core machine stretches past 20 s).
    assert elapsed < 150, elapsed
    assert group_alive(r.pid) == []


def test_writer_killed_mid_save_leaves_the_previous_checkpoint_loadable(tmp_path):
    r = mgpu("train", QUICK, *SMALL, "trainer.checkpoint_every_steps=10", cwd=tmp_path,
             env={"MGPU_FAULT": "kill_in_save@step=20"})
    assert r.returncode == -signal.SIGKILL
    ckpts = tmp_path / "runs/quickstart/checkpoints"
    assert load_ckpt(ckpts / "last.pt")["step"] == 10  # the previous one, whole
    assert [p.name for p in ckpts.iterdir() if p.name.startswith(".")]  # the killed writer's temp file
    resumed = mgpu("train", QUICK, *SMALL, "trainer.checkpoint_every_steps=10", "--resume", "auto", cwd=tmp_path)
    assert resumed.returncode == 0, resumed.output
    assert sorted(p.name for p in ckpts.iterdir()) == ["best.pt", "last.pt"]  # stale temp file cleaned


def test_disk_full_at_save_is_a_clear_error_and_keeps_the_previous_checkpoint(tmp_path):
    r = mgpu("train", QUICK, *SMALL, "trainer.checkpoint_every_steps=10", cwd=tmp_path,
             env={"MGPU_FAULT": "disk_full_in_save@step=20"})
    assert r.returncode == 1
    assert "could not write checkpoint" in r.stderr and "the disk is full" in r.stderr
    assert "previous checkpoint is kept" in r.stderr and "Traceback" not in r.stderr
    ckpts = tmp_path / "runs/quickstart/checkpoints"
    assert load_ckpt(ckpts / "last.pt")["step"] == 10
    assert sorted(p.name for p in ckpts.iterdir()) == ["last.pt"]


def _launch(cwd, *args, env=None):
    return proctree.start([sys.executable, "-m", "mgpucli", "launch", "--cpu", "--nproc", "2", QUICK, *SMALL, *args],
                          cwd=cwd, env={**os.environ, **(env or {})}, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                          text=True)


def _wait_for_step(run_dir, step: int, proc, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    metrics = run_dir / "metrics.jsonl"
    while time.monotonic() < deadline:
        if metrics.exists() and f'"step": {step},' in metrics.read_text():
            return
        assert proc.poll() is None, proc.communicate()
        time.sleep(0.1)
    raise AssertionError(f"step {step} not reached")


COMMON = ["trainer.epochs=3", "+model.dropout=0.1"]  # dropout: the RNG a resume restores is used


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory) -> dict:
    """The reference both resumes must equal: the same job, never stopped (its checkpoints' schedule changes nothing
    of the math)."""
    cwd = tmp_path_factory.mktemp("uninterrupted")
    full = mgpu("launch", "--cpu", "--nproc", "2", QUICK, *SMALL, *COMMON, "run_dir=full", cwd=cwd, timeout=180)
    assert full.returncode == 0, full.output
    return load_ckpt(cwd / "full/checkpoints/last.pt")


def test_sigterm_to_launch_checkpoints_and_resume_equals_uninterrupted(tmp_path, uninterrupted):
    # Every rank is held in step 25 (mid-epoch 2: 16 steps per epoch) until a stop signal arrives, so the SIGTERM
    # sent once step 20 is logged lands mid-epoch for sure, whatever the machine's load.
    proc = _launch(tmp_path, *COMMON, "run_dir=part", env={"MGPU_FAULT": "hold_step@step=25"})
    try:
        _wait_for_step(tmp_path / "part", 20, proc)
        os.killpg(proc.pid, signal.SIGTERM)  # what SLURM / Kubernetes send
        out, err = proc.communicate(timeout=45)
    finally:
        stop_tree(proc)
    assert proc.returncode != 0
    assert "stopped by SIGTERM at step" in err and "--resume auto" in err
    mid = load_ckpt(tmp_path / "part/checkpoints/last.pt")
    assert 20 <= mid["step"] < 48 and mid["mid_epoch"]
    resumed = mgpu("launch", "--cpu", "--nproc", "2", QUICK, *SMALL, *COMMON, "run_dir=part", "--resume", "auto",
                   cwd=tmp_path, timeout=180)
    assert resumed.returncode == 0, resumed.output
    assert same_weights(uninterrupted, load_ckpt(tmp_path / "part/checkpoints/last.pt"))
    assert group_alive(proc.pid) == []


def _checkpointed(run_dir: Path, step: int, proc, epoch_end: bool = False) -> bool:
    assert proc.poll() is None, proc.communicate()
    last = run_dir / "checkpoints/last.pt"  # written whole, then renamed: never read half-written
    if not last.exists():
        return False
    ckpt = load_ckpt(last)
    return ckpt["step"] == step and not (epoch_end and ckpt["mid_epoch"])


def test_sigkill_of_a_worker_then_resume_equals_uninterrupted(tmp_path, uninterrupted):
    # Killed after step 16's checkpoint (the end of epoch 1: 16 steps an epoch) and before step 24's, the run resumes
    # from step 16. With dropout, the RNG it restores must be the one the next epoch's loader iterator draws from.
    # Every rank is held in step 22 until a stop signal: the kill lands in that window for sure.
    common = [*COMMON, "trainer.checkpoint_every_steps=8"]
    proc = _launch(tmp_path, *common, "run_dir=part", env={"MGPU_FAULT": "hold_step@step=22"})
    try:
        # step 16 is saved twice: by checkpoint_every_steps (mid-epoch), then at the epoch's end after validation;
        # the kill comes after the second, or the resume starts from the first (a CI run under load caught that)
        assert wait_until(lambda: _checkpointed(tmp_path / "part", 16, proc, epoch_end=True), 60)
        workers = {int(environ_of(p).get("RANK", -1)): p for p in _children_named(proc.pid, "mgpucli")}
        assert sorted(workers) == [0, 1], workers
        os.kill(workers[1], signal.SIGKILL)
        start = time.monotonic()
        out, err = proc.communicate(timeout=60)
        stopped_after = time.monotonic() - start
    finally:
        stop_tree(proc)
    assert proc.returncode == 1, err
    # an upper bound that catches a hang: well under torch's 30 s teardown grace, which a survivor that ignored the
    # agent's SIGTERM would wait out
    assert stopped_after < 25, (stopped_after, err)
    assert "rank 1 failed first (killed by SIGKILL)" in err, err
    assert all(not _alive(pid) for pid in workers.values())
    result = json.loads((tmp_path / "part/launch.json").read_text())["result"]
    assert result["status"] == "failed" and result["first_failed_rank"] == 1, result
    resumed = mgpu("launch", "--cpu", "--nproc", "2", QUICK, *SMALL, *common, "run_dir=part", "--resume", "auto",
                   cwd=tmp_path, timeout=180)
    assert resumed.returncode == 0, resumed.output
    assert "resumed from part/checkpoints/last.pt at step 16 (epoch 1)" in resumed.output, resumed.output
    assert same_weights(uninterrupted, load_ckpt(tmp_path / "part/checkpoints/last.pt"))


def _alive(pid: int) -> bool:
    return proc_state(pid) not in (None, "Z")


def _children_named(root: int, word: str) -> list[int]:
    from mgpucli.proctree import descendants

    found = []
    for pid in descendants(root):
        try:
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
        except OSError:
            continue
        if word in cmd and " train " in cmd:
            found.append(pid)
    return sorted(found)
