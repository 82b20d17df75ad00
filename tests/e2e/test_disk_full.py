"""A full disk at save, on a real small filesystem (a tmpfs): torch's zip writer fails there with a RuntimeError,
not an OSError, which no injected fault reproduces. Skipped, with the reason, where this test may not mount one."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest
import torch

from mgpucli.engine.checkpoints.files import DiskWriteError, save_atomic
from tests.inproc import cli
from tests.procs import RECIPES, mgpu


@pytest.fixture
def small_disk(tmp_path):
    """A 2 MiB tmpfs at tmp_path/disk, unmounted afterwards."""
    mount = tmp_path / "disk"
    mount.mkdir()
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=2m", "tmpfs", str(mount)], capture_output=True,
                          text=True, timeout=30)
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here ({done.stderr.strip() or done.returncode}): needs root")
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], capture_output=True, timeout=30)


def _fill(disk: Path, leave: int) -> None:
    """Fill ``disk`` until about ``leave`` bytes are free."""
    free = shutil.disk_usage(disk).free
    (disk / "filler").write_bytes(b"\0" * max(0, free - leave))


def test_a_disk_that_fills_while_writing_is_named_and_the_last_checkpoint_kept(small_disk):
    save_atomic({"w": torch.zeros(1000)}, small_disk / "last.pt")
    before = (small_disk / "last.pt").read_bytes()
    _fill(small_disk, leave=200_000)
    with pytest.raises(DiskWriteError) as err:  # 4 MB of weights on a disk with 0.2 MB free
        save_atomic({"w": torch.zeros(1_000_000)}, small_disk / "last.pt")
    text = str(err.value)
    assert "the disk is full" in text and "MiB free" in text and "previous checkpoint is kept" in text, text
    assert (small_disk / "last.pt").read_bytes() == before
    assert sorted(p.name for p in small_disk.iterdir()) == ["filler", "last.pt"]  # no temp file left


def test_a_save_known_not_to_fit_is_refused_before_writing(small_disk):
    save_atomic({"w": torch.zeros(200_000)}, small_disk / "last.pt")  # ~0.8 MB
    _fill(small_disk, leave=300_000)
    with pytest.raises(DiskWriteError, match=r"not written: the disk is too full \(needs ~0\.8 MiB, 0\.\d MiB free"):
        save_atomic({"w": torch.zeros(200_000)}, small_disk / "last.pt")


def test_a_run_whose_disk_fills_is_diagnosed_as_a_full_disk(tmp_path, small_disk):
    run_dir = small_disk / "run"
    _fill(small_disk, leave=60_000)  # room for the run's small files, not for a checkpoint
    r = mgpu("launch", "--cpu", "--nproc", "2", "--log-dir", str(tmp_path / "logs"), str(RECIPES / "quickstart.yaml"),
             f"run_dir={run_dir}", "trainer.epochs=1", "data.train.num_samples=512", "data.val.num_samples=101",
             "trainer.tensorboard=false", cwd=tmp_path, timeout=180)  # 8 steps, then the checkpoint that fills it
    assert r.returncode == 1, r.output
    assert "the disk is full" in r.stderr and "Traceback" not in r.stderr.split("diagnosis:")[-1], r.stderr
    doctor = cli("doctor", str(run_dir), "--json", cwd=tmp_path)  # reads the run dir: in this process
    report = json.loads(doctor.stdout)
    assert report["first_failure"]["signature"] == "disk_full", report
    assert "disk is full" in report["first_failure"]["title"], report
