"""A run stopped on a signal mid-training, then ``mgpu doctor RUN_DIR`` on it: preempted (exit 75), not failed.

The README's own command (``mgpu launch --cpu --nproc 2 quickstart``, run in a temporary directory) is
stopped three ways: Ctrl-C's SIGINT to the launcher, SIGTERM to the launcher (what SLURM sends), and SIGTERM to
one worker directly. Every process carries a unique tag in its environment; each test ends with none left.
"""

from __future__ import annotations

import json
import os
import re
import signal
import sys
from pathlib import Path

import pytest

from mgpucli import proctree
from tests.procs import TAG, environ_of, load_ckpt, mgpu, stop_tree, wait_until
from tests.procs import tagged as tagged_by

ARGS = ["--cpu", "--nproc", "2", "quickstart", "trainer.epochs=200", "trainer.log_every=5"]  # runs until stopped
ERROR_LINE = re.compile(r"^(\[rank\d+\]:)?\s*error:", re.MULTILINE)
STOP_LINE = re.compile(r"mgpu train: stopped by (SIG\w+|a signal on another rank) at step (\d+)")


def _env(tag: str, extra: dict[str, str] | None = None) -> dict[str, str]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("MGPU_FAULT", "RANK", "WORLD_SIZE",
                                                                        "LOCAL_RANK", "MASTER_", "OMP_NUM"))}
    return {**clean, "PYTHONUNBUFFERED": "1", TAG: tag, **(extra or {})}


def _stopped_launch(tmp_path: Path, tag: str, how: str) -> tuple[int, str]:
    """Start the launch, wait until it trains, stop it ``how``; (its exit code, its output)."""
    out_path, err_path = tmp_path / "launch.out", tmp_path / "launch.err"
    metrics = tmp_path / "runs" / "quickstart" / "metrics.jsonl"
    with open(out_path, "w") as out, open(err_path, "w") as err:
        proc = proctree.start([sys.executable, "-m", "mgpucli", "launch", *ARGS], cwd=tmp_path, env=_env(tag),
                              stdout=out, stderr=err)
    try:
        def training() -> bool:
            assert proc.poll() is None, err_path.read_text()
            return metrics.is_file() and '"split": "train"' in metrics.read_text()

        assert wait_until(training, 90), f"training never started:\n{err_path.read_text()}"
        if how == "worker":
            workers = wait_until(lambda: {int(e["RANK"]): pid for pid in tagged_by(TAG, tag)
                                          if (e := environ_of(pid)).get("MGPU_LAUNCH_PID") == str(proc.pid)
                                          and "RANK" in e and pid != proc.pid}, 10)
            assert sorted(workers) == [0, 1], workers
            os.kill(workers[1], signal.SIGTERM)
        else:
            os.kill(proc.pid, signal.SIGINT if how == "SIGINT" else signal.SIGTERM)
        code = proc.wait(timeout=60)  # torch's shutdown window is 30 s
    finally:
        stop_tree(proc)
    return code, out_path.read_text(errors="replace") + err_path.read_text(errors="replace")


@pytest.mark.parametrize("how", ["SIGINT", "SIGTERM", "worker"])
def test_a_stopped_run_is_reported_as_preempted(tmp_path: Path, tag: str, how: str, no_heavy_imports: dict):
    code, output = _stopped_launch(tmp_path, tag, how)
    assert code == 75, output
    run_dir = tmp_path / "runs" / "quickstart"
    result = json.loads((run_dir / "launch.json").read_text())["result"]
    step = load_ckpt(run_dir / "checkpoints" / "last.pt")["step"]
    assert result["status"] == "preempted" and result["step"] == step > 0

    # The worker said the same step, as a note: no `error:` line anywhere, for the stop or anything else.
    logs = "".join(p.read_text(errors="replace") for p in sorted(run_dir.glob("logs/*/attempt_0/*/std*.log")))
    said = STOP_LINE.findall(logs)
    assert said and {int(s) for _, s in said} == {step}, said
    assert not ERROR_LINE.search(logs) and not ERROR_LINE.search(output), output
    signal_name = "SIGTERM" if how == "worker" else how
    assert said[0][0] == ("a signal on another rank" if how == "worker" else signal_name)

    resume = "mgpu launch " + " ".join(ARGS) + " --resume auto"
    human = mgpu("doctor", str(run_dir), cwd=tmp_path, env=_env(tag, no_heavy_imports), timeout=60)
    assert human.returncode == 75, human.output
    by = f"{signal_name} (sent to rank 1)" if how == "worker" else signal_name
    assert f"was preempted by {by} at step {step} " in human.stderr
    assert f"continue from checkpoints/last.pt (step {step}): {resume}\n" in human.stderr
    for wrong in ("failed", "No known failure signature", "error", "exit code None"):
        assert wrong not in human.output, human.output

    res = mgpu("doctor", str(run_dir), "--json", cwd=tmp_path, env=_env(tag, no_heavy_imports), timeout=60)
    assert res.returncode == 75 and res.stderr == "", res.stderr
    report = json.loads(res.stdout)
    assert (report["status"], report["exit_code"], report["finished"]) == ("preempted", 75, False)
    assert report["first_failure"] is None and report["other_failures"] == []
    p = report["preempted"]
    assert (p["signal"], p["step"], p["checkpoint_step"], p["checkpoint_complete"]) == (signal_name, step, step, True)
    assert p["signalled_rank"] == (1 if how == "worker" else None)
    assert report["resume_command"] == resume
    saved = json.loads((run_dir / "postmortem.json").read_text())
    assert (saved["status"], saved["exit_code"], saved["preempted"]["step"]) == ("preempted", 75, step)
