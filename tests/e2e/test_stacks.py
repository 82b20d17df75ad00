"""Where a stuck rank is stuck: its Python stack, asked for before teardown, in the launch summary and the post-mortem;
and `mgpu doctor RUN_DIR --stacks` on a running job. Real launches, 2 CPU workers (gloo)."""

from __future__ import annotations

import json
import os
import re
import signal
from pathlib import Path

import pytest

from tests.e2e.test_launch import Launch, rank0_log, run_launch, run_side_by_side, wait_for_training, wait_until
from tests.procs import REPO, mgpu

BLOCKING = '''
import os
import time

import torch
from torch.utils.data import Dataset


class Blocking(Dataset):
    def __init__(self, num_samples=512, num_features=32, num_classes=4, **_):
        gen = torch.Generator().manual_seed(0)
        self.x = torch.randn(num_samples, num_features, generator=gen)
        self.y = torch.randint(0, num_classes, (num_samples,), generator=gen)
        self.calls = 0

    def __len__(self):
        return len(self.x)

    def __getitem__(self, i):
        self.calls += 1
        if os.environ.get("RANK") == "1" and self.calls > 200:
            time.sleep(3600)  # a read that never answers
        return self.x[i], self.y[i]
'''


BLOCKING_ARGS = ["--cpu", "--nproc", "2", "quickstart", "data.train._target_=blocking_data.Blocking",
                 "data.num_workers=0"]


def _launch_blocking(tmp_path: Path, tag: str, *extra: str):
    """The quickstart with a training set whose rank 1 blocks after a few batches: (exit code, the launch)."""
    (tmp_path / "blocking_data.py").write_text(BLOCKING)
    code, launch = run_launch([*BLOCKING_ARGS, *extra], tmp_path, tag, timeout=150)
    return code, launch


STUCK_SCRIPT = REPO / "tests" / "e2e" / "scripts" / "stuck_rank.py"


@pytest.fixture(scope="module")
def timed_out(tmp_path_factory) -> dict[str, tuple[int, Launch]]:
    """The two jobs whose rank 1 is stuck while rank 0 waits out a 10 s collective timeout, launched side by side
    (one wait for both), each in its own directory: "dataset" (the quickstart, its training set blocking on rank 1)
    and "script" (tests/e2e/scripts/stuck_rank.py); name -> (exit code, the launch)."""
    data_dir, script_dir = tmp_path_factory.mktemp("dataset"), tmp_path_factory.mktemp("script")
    (data_dir / "blocking_data.py").write_text(BLOCKING)
    return run_side_by_side({"dataset": ([*BLOCKING_ARGS, "trainer.timeout_s=10"], data_dir),
                             "script": (["--cpu", "--nproc", "2", "--run-dir", "run", str(STUCK_SCRIPT)], script_dir)},
                            timeout=150)


def test_a_rank_stuck_in_its_dataset_is_shown_at_its_line(timed_out):
    code, launch = timed_out["dataset"]
    tmp_path = launch.cwd
    err = launch.err_path.read_text()
    assert code == 1, launch.output
    line = "rank 1 was at " + str(tmp_path / "blocking_data.py") + ":22 in __getitem__: time.sleep(3600)"
    assert line in err, err
    doctor = mgpu("doctor", "runs/quickstart", "--json", cwd=tmp_path, timeout=60)
    frame = json.loads(doctor.stdout)["stacks"]["1"]["user_frame"]
    assert (Path(frame["file"]).name, frame["line"], frame["function"]) == ("blocking_data.py", 22, "__getitem__")


def test_a_scripts_stuck_rank_is_shown_at_its_line(timed_out):
    code, launch = timed_out["script"]
    err = launch.err_path.read_text()
    assert code != 0, launch.output
    assert f"rank 1 was at {STUCK_SCRIPT}:13 in <module>: time.sleep(3600)  # stuck here" in err, err


def _steps(log: Path | str) -> list[str]:
    """The training steps rank 0 logged (its stderr.log, or that log's text)."""
    return re.findall(r"step \d+ epoch", log if isinstance(log, str) else log.read_text(errors="replace"))


def test_doctor_stacks_shows_every_rank_of_a_running_job_which_goes_on(tmp_path: Path, tag: str):
    launch = Launch(["--cpu", "--nproc", "2", "quickstart", "trainer.epochs=60", "trainer.cpu_threads=1"], tmp_path,
                    tag)
    try:
        run_dir = tmp_path / "runs" / "quickstart"
        wait_for_training(run_dir, launch)
        shown = mgpu("doctor", str(run_dir), "--stacks", cwd=tmp_path, timeout=60)
        assert shown.returncode == 0, shown.output
        assert "rank 0 was " in shown.stderr and "rank 1 was " in shown.stderr, shown.stderr
        for rank in (0, 1):  # where in mgpu's loop each rank was, even when caught in a library or an import
            line = next(line for line in shown.stderr.splitlines() if line.startswith(f"rank {rank} was "))
            assert "/mgpucli/" in line, shown.stderr
        logged = rank0_log(run_dir).read_text(errors="replace")
        assert wait_until(lambda: len(_steps(rank0_log(run_dir))) > len(_steps(logged)) or launch.proc.poll() is not
                          None, 60), launch.output  # the job trains on: a step logged after the stacks were shown
        os.kill(launch.pid, signal.SIGTERM)  # then stops, as a preemption would
        assert launch.wait(timeout=60) == 75, launch.output
    finally:
        launch.cleanup()
    after = mgpu("doctor", str(run_dir), "--stacks", cwd=tmp_path, timeout=60)
    assert after.returncode == 1 and "no rank of its latest attempt is running" in after.stderr


def test_a_stalled_rank_stops_the_job_with_every_ranks_stack(tmp_path: Path, tag: str):
    """trainer.stall_s: no progress for that long and mgpu launch stops the job, naming the rank that is behind."""
    code, launch = _launch_blocking(tmp_path, tag, "trainer.stall_s=5")
    err = launch.err_path.read_text()
    assert code == 1, launch.output
    assert "rank 1 made no progress for 5 s (stall_s=5): still at step 6 in 'loading a batch'" in err, err
    assert "rank 1 was at " + str(tmp_path / "blocking_data.py") + ":22 in __getitem__" in err, err
    report = json.loads(mgpu("doctor", "runs/quickstart", "--json", cwd=tmp_path, timeout=60).stdout)
    assert report["status"] == "stalled" and report["first_failure"]["signature"] == "stalled", report
    assert report["stacks"]["1"]["user_frame"]["function"] == "__getitem__"
