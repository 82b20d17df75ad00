"""A signal that reaches ``mgpu launch`` at the very end of a run: after the last step.

Once the final checkpoint is complete and every rank has finished, the run is finished: the launch exits 0 and
``mgpu doctor RUN_DIR`` says so (exit 0, nothing to resume). Before that, the ranks still agree on the stop: the
final checkpoint is written and the launch exits 75, as mid-training. No clock is raced: the test-only faults
``hold_at_exit`` and ``hold_last_save`` (mgpucli/faults.py) hold every rank there until the signal comes (so the
launcher is still running when it does), and the test signals only once the run's files show it past the point
that matters: the final checkpoint written, or every worker's mark that the run finished.
"""

from __future__ import annotations

import json
import os
import signal
import sys
from pathlib import Path

import pytest

from mgpucli import proctree
from tests.e2e.test_preempted_postmortem import _env
from tests.procs import load_ckpt, mgpu, stop_tree, wait_until

# 256 samples on 2 ranks at 32 per batch: 4 steps, one epoch, one validation, then the final checkpoint.
ARGS = ["--cpu", "--nproc", "2", "quickstart", "trainer.epochs=1", "data.train.num_samples=256",
        "data.val.num_samples=64", "trainer.log_every=2", "trainer.cpu_threads=1"]
LAST_STEP = 4


def _signalled_launch(tmp_path: Path, tag: str, fault: str, held, sig: signal.Signals) -> tuple[int, str, Path]:
    """Launch with ``fault`` holding every rank, wait until ``held(run_dir)``, send ``sig`` to the launcher only;
    (its exit code, its output, the run dir)."""
    run_dir = tmp_path / "runs" / "quickstart"
    out_path, err_path = tmp_path / "launch.out", tmp_path / "launch.err"
    env = _env(tag, {"MGPU_FAULT": fault, "MGPU_FAULT_SLEEP": "120"})  # the bound: a hold that never ends fails
    with open(out_path, "w") as out, open(err_path, "w") as err:
        proc = proctree.start([sys.executable, "-m", "mgpucli", "launch", *ARGS], cwd=tmp_path, env=env, stdout=out,
                              stderr=err)
    try:
        def there() -> bool:
            assert proc.poll() is None, err_path.read_text()
            return held(run_dir)

        assert wait_until(there, 120), f"the workers never reached the hold:\n{err_path.read_text()}"
        os.kill(proc.pid, sig)
        code = proc.wait(timeout=60)  # torch's shutdown window is 30 s
    finally:
        stop_tree(proc)
    return code, out_path.read_text(errors="replace") + err_path.read_text(errors="replace"), run_dir


def _final_checkpoint_written(run_dir: Path) -> bool:
    """``last.pt`` is there: the run's only save (one epoch) is the final one, and it is atomic."""
    return (run_dir / "checkpoints" / "last.pt").is_file()


def _all_finished(run_dir: Path) -> bool:
    """Both workers left their mark that the run finished (every rank agreed, the final checkpoint complete)."""
    return len(list(run_dir.glob("logs/*/attempt_0/*/mgpu_finished"))) == 2


def _last_validation_done(run_dir: Path) -> bool:
    """The last epoch's validation is recorded: the ranks are past the last step, before the final checkpoint."""
    metrics = run_dir / "metrics.jsonl"
    return metrics.is_file() and '"split": "val"' in metrics.read_text()


def _doctor(run_dir: Path, tmp_path: Path, tag: str, no_heavy_imports: dict):
    human = mgpu("doctor", str(run_dir), cwd=tmp_path, env=_env(tag, no_heavy_imports), timeout=60)
    res = mgpu("doctor", str(run_dir), "--json", cwd=tmp_path, env=_env(tag, no_heavy_imports), timeout=60)
    return human, res.returncode, json.loads(res.stdout)


@pytest.mark.parametrize(("sig", "held"), [(signal.SIGINT, _final_checkpoint_written),  # anywhere after the write
                                           (signal.SIGTERM, _all_finished)],  # every rank done, in its teardown
                         ids=["SIGINT", "SIGTERM"])
def test_a_signal_after_the_final_checkpoint_leaves_the_run_finished(tmp_path: Path, tag: str, sig, held,
                                                                     no_heavy_imports: dict):
    code, output, run_dir = _signalled_launch(tmp_path, tag, "hold_at_exit", held, sig)
    assert code == 0, output
    assert f"mgpu launch: finished; {sig.name} arrived during the teardown" in output and "Nothing to resume" in output
    assert "--resume auto" not in output and "error" not in output.lower(), output
    assert load_ckpt(run_dir / "checkpoints" / "last.pt")["step"] == LAST_STEP
    result = json.loads((run_dir / "launch.json").read_text())["result"]
    assert (result["status"], result["exit_code"], result["signal"]) == ("succeeded", 0, sig.name)

    human, json_code, report = _doctor(run_dir, tmp_path, tag, no_heavy_imports)
    assert human.returncode == 0 == json_code, human.output
    late = f"finished ({sig.name} arrived during the teardown, after the final checkpoint was complete)."
    assert late in human.stderr, human.output
    for wrong in ("--resume auto", "stopped", "preempted", "continue from"):
        assert wrong not in human.output, human.output
    assert (report["status"], report["finished"], report["exit_code"]) == ("succeeded", True, 0)
    assert report["resume_command"] is None and report["first_failure"] is None and report["preempted"] is None


def test_a_signal_after_the_last_step_before_the_final_checkpoint_saves_it_and_exits_75(tmp_path: Path,
                                                                                         tag: str,
                                                                                         no_heavy_imports: dict):
    code, output, run_dir = _signalled_launch(tmp_path, tag, "hold_last_save", _last_validation_done, signal.SIGTERM)
    assert code == 75, output
    assert f"stopped by SIGTERM at step {LAST_STEP}" in output and "--resume auto" in output
    assert load_ckpt(run_dir / "checkpoints" / "last.pt")["step"] == LAST_STEP
    result = json.loads((run_dir / "launch.json").read_text())["result"]
    assert (result["status"], result["step"], result["signal"]) == ("preempted", LAST_STEP, "SIGTERM")

    human, json_code, report = _doctor(run_dir, tmp_path, tag, no_heavy_imports)
    assert human.returncode == 75 == json_code, human.output
    assert f"was preempted by SIGTERM at step {LAST_STEP} " in human.stderr
    assert (report["preempted"]["checkpoint_step"], report["preempted"]["checkpoint_complete"]) == (LAST_STEP, True)
