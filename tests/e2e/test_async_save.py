"""``trainer.async_save``: sharded checkpoints written in the background while training goes on. A Ctrl-C while one
is in flight ends with exit 75 and a complete checkpoint; a save that fails (a full disk, a real small tmpfs) is
said and the previous checkpoint kept. No clock is raced: the test-only fault ``hold_async_save`` holds the save in
flight (its shards written, not yet committed) until the signal comes, and the test signals once the shards are
on disk."""

from __future__ import annotations

import json
import os
import re
import signal
import sys
from pathlib import Path

import pytest

from mgpucli import proctree
from tests.e2e.test_disk_full import small_disk  # noqa: F401 - the fixture: a tmpfs (skipped where none mounts)
from tests.e2e.test_preempted_postmortem import _env
from tests.inproc import cli
from tests.procs import RECIPES, load_ckpt, stop_tree, torchrun, wait_until

CHARLM = str(RECIPES / "charlm.yaml")
ASYNC = ["vars.block_size=32", "model.d_model=64", "model.n_head=2", "+data.train.num_chars=12000", "data.val=null",
         "trainer.best_metric=null", "data.batch_size=8", "trainer.cpu_threads=1", "trainer.strategy=fsdp",
         "trainer.async_save=true", "trainer.checkpoint_every_steps=2"]


def test_ctrl_c_during_a_background_save_exits_75_with_a_complete_checkpoint(tmp_path: Path, tag: str):
    out_path, err_path = tmp_path / "launch.out", tmp_path / "launch.err"
    env = _env(tag, {"MGPU_FAULT": "hold_async_save@step=2", "MGPU_FAULT_SLEEP": "120"})  # the bound of the hold
    args = ["launch", "--cpu", "--nproc", "2", CHARLM, *ASYNC, "trainer.max_steps=40", "trainer.log_every=2",
            "run_dir=run"]
    with open(out_path, "w") as out, open(err_path, "w") as err:
        proc = proctree.start([sys.executable, "-m", "mgpucli", *args], cwd=tmp_path, env=env, stdout=out,
                              stderr=err)
    try:
        def in_flight() -> bool:  # step 2's shards are on disk, its commit held
            assert proc.poll() is None, err_path.read_text()
            return (tmp_path / "run/checkpoints/.step-00000002.dcp.tmp/.metadata").is_file()

        assert wait_until(in_flight, 120), f"the save never got in flight:\n{err_path.read_text()}"
        assert not (tmp_path / "run/checkpoints/last.dcp").exists()  # not the run's checkpoint until complete
        os.kill(proc.pid, signal.SIGINT)
        code = proc.wait(timeout=90)
    finally:
        stop_tree(proc)
    output = out_path.read_text() + err_path.read_text()
    assert code == 75, output
    stopped = re.search(r"stopped by SIGINT at step (\d+)", output)
    assert stopped, output
    ckpts = tmp_path / "run/checkpoints"
    assert load_ckpt(ckpts / "last.dcp")["step"] == int(stopped.group(1)) > 2  # complete, readable
    assert not list(ckpts.glob(".*")), list(ckpts.iterdir())  # nothing half-written under any name


@pytest.mark.parametrize("in_background", [True, False], ids=["async", "sync"])
def test_a_sharded_save_that_fills_the_disk_is_said_and_the_previous_checkpoint_kept(small_disk,  # noqa: F811
                                                                                      in_background):
    """Each checkpoint is ~1.8 MB on a 3 MiB disk: step 2's fits, step 4's does not while step 2's is kept; each
    rank's cause is said once, by rank 0, whether the shards were written in the background or not."""
    import subprocess

    subprocess.run(["mount", "-o", "remount,size=3m", str(small_disk)], check=True, capture_output=True, timeout=30)
    r = torchrun(2, "train", CHARLM, *ASYNC, f"trainer.async_save={str(in_background).lower()}",
                 "trainer.max_steps=4", "trainer.log_every=2", f"run_dir={small_disk / 'run'}", cwd=small_disk.parent)
    assert r.returncode == 1, r.output
    how = " in the background (trainer.async_save)" if in_background else ""
    said = re.escape(f"could not write checkpoint {small_disk / 'run/checkpoints/step-00000004.dcp'}{how}: ")
    assert re.search(said + r"rank \d: the disk is full", " ".join(r.stderr.split())), r.output  # whichever filled it
    assert "The previous checkpoint is kept" in r.stderr and "mgpucli/engine" not in r.stderr, r.output  # no traceback
    assert r.stderr.count("could not write checkpoint") == 1, r.output  # rank 0 says it for all
    ckpts = small_disk / "run/checkpoints"
    assert os.readlink(ckpts / "last.dcp") == "step-00000002.dcp" and not list(ckpts.glob(".*"))
    validated = cli("validate", str(ckpts / "last.dcp"), "--split", "train", "--json", cwd=small_disk.parent)
    assert validated.returncode == 0 and json.loads(validated.stdout)["checkpoint"]["step"] == 2, validated.output
