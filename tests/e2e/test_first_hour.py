"""The README's tour as a new user meets it: a second launch into a finished run's dir, and what it must not break.

Every launch runs the real CLI with 2 CPU workers (gloo) in a temporary directory, tagged and cleaned up as in
tests/e2e/test_launch.py.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from mgpucli import proctree
from tests.e2e.test_launch import SHORT, run_launch, tagged, wait_until
from tests.inproc import COMPOSE_CHILD, cli
from tests.procs import assert_usage_error


def _doctor(run_dir: Path, cwd: Path) -> tuple[int, dict]:
    """``mgpu doctor RUN_DIR --json`` in the test process: reading a run's records starts no process."""
    done = cli("doctor", str(run_dir), "--json", cwd=cwd)
    return done.returncode, json.loads(done.stdout)


def _torch_log_dirs(run_dir: Path) -> set[str]:
    """torch's per-launch log folders: one appears for every launch that started workers."""
    return {p.name for p in (run_dir / "logs").glob("mgpu-*") if p.is_dir()}


@pytest.fixture(scope="module")
def finished(tmp_path_factory) -> Path:
    """The working directory of a finished 2-process launch of the quickstart (``runs/quickstart``), read-only: the
    tests that launch again into it work on a copy (``finished_here``)."""
    cwd = tmp_path_factory.mktemp("finished")
    mine = uuid.uuid4().hex
    code, first = run_launch(["--cpu", "--nproc", "2", "quickstart", *SHORT], cwd, mine)
    assert code == 0, first.output
    assert wait_until(lambda: not tagged(mine), 20), f"processes left behind: {tagged(mine)}"
    return cwd


@pytest.fixture
def finished_here(finished: Path, tmp_path: Path) -> Path:
    """``finished``'s run copied into tmp_path, its launch records naming the copy's files, as if it had run there."""
    shutil.copytree(finished / "runs", tmp_path / "runs", symlinks=True)
    for record in (tmp_path / "runs").rglob("launch*.json"):
        record.write_text(record.read_text().replace(str(finished), str(tmp_path)))
    return tmp_path / "runs" / "quickstart"


def test_second_launch_into_a_finished_run_is_refused_before_any_worker(finished_here: Path):
    """The launcher's own refusal, run in the test process (a worker it started would fail the test)."""
    run_dir, cwd = finished_here, finished_here.parents[1]
    records = {name: (run_dir / name).read_bytes() for name in ("launch.json", "metrics.jsonl")}
    logs_before = _torch_log_dirs(run_dir)

    again = cli("launch", "--cpu", "--nproc", "2", "quickstart", *SHORT, cwd=cwd, allowed=(COMPOSE_CHILD,))
    assert again.returncode == 2, again.output
    err = again.stderr
    assert "already holds checkpoints" in err and "--resume auto" in err and "--overwrite" in err, err
    assert "name=" in err and "Traceback" not in again.output
    assert _torch_log_dirs(run_dir) == logs_before  # no worker started
    assert {name: (run_dir / name).read_bytes() for name in records} == records
    doctor_code, report = _doctor(run_dir, cwd)
    assert doctor_code == 0 and report["finished"] and report["status"] == "succeeded", report

    for flag in ("--dry-run", "--check"):  # the checks that promise "it would start" say so too
        r = cli("launch", "--cpu", "--nproc", "2", "quickstart", *SHORT, flag, cwd=cwd, allowed=(COMPOSE_CHILD,))
        assert_usage_error(r, "already holds checkpoints", "--resume auto", "--overwrite")
        assert flag not in r.stderr.split("error:", 1)[1]  # the suggested commands launch for real


def test_a_launch_that_fails_before_training_keeps_the_earlier_records(tmp_path: Path, tag: str,
                                                                       finished_here: Path):
    run_dir = finished_here
    launch_json = (run_dir / "launch.json").read_bytes()

    # A resume whose checkpoint does not fit the model: only the workers can know, after they started.
    code, bad = run_launch(["--cpu", "--nproc", "2", "quickstart", *SHORT, "model.hidden=[8]", "--resume", "auto"],
                           tmp_path, tag, name="bad")
    assert code == 2, bad.output
    err = bad.err_path.read_text()
    assert "every rank stopped on bad input" in err and "don't fit the recipe's model" in err, err
    assert "untouched" in err, err
    assert (run_dir / "launch.json").read_bytes() == launch_json
    assert not (run_dir / "postmortem.json").exists() or "failed" not in (run_dir / "postmortem.json").read_text()
    doctor_code, report = _doctor(run_dir, tmp_path)
    assert doctor_code == 0 and report["finished"], report
    pending = sorted(run_dir.glob("logs/launch-*/launch.json"))
    assert len(pending) == 1 and json.loads(pending[0].read_text())["result"]["status"] == "failed"
    assert (pending[0].parent / "postmortem.json").is_file()  # the failed launch's own report, beside its record

    # A launch that does start training becomes the run dir's record, and the stale report goes.
    code, fresh = run_launch(["--cpu", "--nproc", "2", "quickstart", *SHORT, "--overwrite"], tmp_path, tag,
                             name="fresh")
    assert code == 0, fresh.output
    record = json.loads((run_dir / "launch.json").read_text())
    assert "--overwrite" in record["argv"] and record["result"]["status"] == "succeeded"
    assert "checkpoints/last.pt" in fresh.err_path.read_text() and "metrics.jsonl" in fresh.err_path.read_text()


def test_epochs_are_numbered_alike_everywhere_and_the_epoch_row_is_the_epoch_mean(tmp_path: Path, tag: str):
    """1024 samples: 16 steps of 2 x 32 per epoch, 3 epochs; a row every 10 steps, so an epoch's last interval is
    not the epoch."""
    code, run = run_launch(["--cpu", "--nproc", "2", "quickstart", "data.train.num_samples=1024",
                            "trainer.log_every=10", "trainer.cpu_threads=1"], tmp_path, tag)
    assert code == 0, run.output
    run_dir = tmp_path / "runs" / "quickstart"
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    train = [r for r in records if r["split"] == "train"]
    val = [r for r in records if r["split"] == "val"]
    assert [r["epoch"] for r in val] == [1, 2, 3] and [r["step"] for r in val] == [16, 32, 48]
    assert {r["epoch"] for r in train} == {1, 2, 3}
    assert all(r["epoch"] == (r["step"] - 1) // 16 + 1 for r in train)  # 16 steps of 2 x 32 samples per epoch

    lines = re.findall(r"epoch (\d+) done  train \(epoch mean\): loss (\S+)", run.output)
    assert [int(n) for n, _ in lines] == [1, 2, 3], run.output
    previous = 0
    for number, shown in lines:  # each interval's samples: its steps x the global batch (64)
        mine = [r for r in train if r["epoch"] == int(number)]
        steps = [r["step"] - p for r, p in zip(mine, [previous] + [r["step"] for r in mine[:-1]], strict=True)]
        previous = mine[-1]["step"]
        mean = sum(r["loss"] * n for r, n in zip(mine, steps, strict=True)) / sum(steps)
        assert float(shown) == pytest.approx(mean, rel=1e-3), (number, shown, mean)
        assert float(shown) != pytest.approx(mine[-1]["loss"], rel=1e-3)  # not the last interval's

    checked = cli("validate", str(run_dir / "checkpoints" / "last.pt"), "--json", cwd=tmp_path)
    assert checked.returncode == 0, checked.output
    assert json.loads(checked.stdout)["checkpoint"]["epoch"] == 3
    shown = cli("validate", str(run_dir / "checkpoints" / "last.pt"), cwd=tmp_path)
    assert "(epoch 3, step 48)" in shown.stderr.replace("\n", " "), shown.output


def _on_a_terminal(args: list[str], cwd: Path, tag: str, timeout: float = 120) -> tuple[int, str]:
    """Run ``mgpu launch`` with its stderr on a pseudo-terminal, as a user's shell would; (exit code, what it drew)."""
    import os
    import pty
    import threading

    master, slave = pty.openpty()
    env = {**os.environ, "MGPU_E2E_TAG": tag, "COLUMNS": "160", "TERM": "xterm"}
    proc = proctree.start([sys.executable, "-m", "mgpucli", "launch", *args], cwd=cwd, env=env,
                          stdout=subprocess.DEVNULL, stderr=slave)
    os.close(slave)
    chunks: list[bytes] = []

    def drain():
        while True:
            try:
                data = os.read(master, 65536)
            except OSError:  # EIO: the terminal's last writer is gone
                return
            if not data:
                return
            chunks.append(data)

    reader = threading.Thread(target=drain, daemon=True)
    reader.start()
    try:
        code = proc.wait(timeout=timeout)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, 9)
            proc.wait(timeout=10)
        reader.join(timeout=10)
        os.close(master)
    text = b"".join(chunks).decode(errors="replace")
    return code, re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", text)


def test_launch_on_a_terminal_shows_rank_0_under_a_live_progress_bar(tmp_path: Path, tag: str):
    code, shown = _on_a_terminal(["--cpu", "--nproc", "2", "charlm", "trainer.max_steps=40", "trainer.log_every=20",
                                  "trainer.epochs=1"], tmp_path, tag)
    assert code == 0, shown
    assert re.search(r"epoch 1/1 .* \d+/88 loss \S+ \S+ samples/s", shown), shown  # the bar, drawn from rank 0
    assert "step 20 epoch 1" in shown and "[rank0]:" not in shown and "[rank1]:" not in shown  # lines, as they come
    assert "epoch 1 done  train (epoch mean):" in shown
    assert "checkpoint: runs/charlm/checkpoints/last.pt" in shown and "metrics: runs/charlm/metrics.jsonl" in shown
    assert not list((tmp_path / "runs" / "charlm" / "logs").glob(".progress-*"))  # its progress file is gone
