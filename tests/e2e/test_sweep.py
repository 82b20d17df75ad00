"""``mgpu sweep`` on real processes: 3 quickstart trials over optim.lr, 2 at a time on CPU slots, one of them failing
at run time (a learning rate that makes the loss NaN); and the same good trials stopped by Ctrl-C and continued by
the same command, their final weights bitwise those of the sweep that was never stopped.

Each sweep runs once for the module (its trials are the launches: 1 process each, one epoch). What needs no process
(the doctor of a sweep folder, ``mgpu runs``) runs in-process.
"""

from __future__ import annotations

import json
import os
import signal
import sys
from pathlib import Path

import pytest
import torch

from mgpucli import proctree
from tests.inproc import cli
from tests.procs import TAG, assert_usage_error, load_ckpt, mgpu, stop_tree, tagged, wait_until

COMMON = ["--cpu", "--parallel", "2", "quickstart", "trainer.epochs=1"]  # 128 steps on 1 process
GOOD = "optim.lr=0.1,0.01"
WITH_A_NAN = "optim.lr=0.1,1e6,0.01"  # 1e6: the loss is NaN within a few steps
HELD_AT = 30  # the interrupted sweep's trials are held in this step until the stop signal reaches them


@pytest.fixture(scope="module")
def cwd(tmp_path_factory):
    return tmp_path_factory.mktemp("sweep")


@pytest.fixture(scope="module")
def finished(cwd):
    """The sweep never stopped: exit 1 (one trial failed), the others finished."""
    return mgpu("sweep", "--name", "whole", *COMMON, WITH_A_NAN, cwd=cwd, timeout=300)


def _record(cwd: Path, name: str) -> dict:
    return json.loads((cwd / "runs" / name / "sweep.json").read_text())


def test_a_sweep_runs_its_trials_two_at_a_time_and_names_the_best(cwd, finished):
    assert finished.returncode == 1, finished.output
    rec = _record(cwd, "whole")
    trials = {t["name"]: t for t in rec["trials"]}
    assert list(trials) == ["0-lr=0.1", "1-lr=1000000.0", "2-lr=0.01"]
    assert all((cwd / "runs/whole" / name / "checkpoints").is_dir() for name in trials)
    first, second = trials["0-lr=0.1"], trials["1-lr=1000000.0"]
    assert first["started"] < second["ended"] and second["started"] < first["ended"]  # side by side
    assert {first["slot"], second["slot"]} == {"cpu0", "cpu1"}
    assert [t["state"] for t in trials.values()] == ["finished", "failed", "finished"]
    assert rec["metric"] == "accuracy" and rec["mode"] == "max"
    best = max((t for t in trials.values() if t["best"] is not None), key=lambda t: t["best"])
    assert f"best: trial {best['name']} ({'optim.lr=' + best['values']['optim.lr']}), accuracy" in finished.stderr
    assert f"\"run_dir='runs/whole/{best['name']}-alone'\"" in finished.stderr  # the command that reruns it alone
    assert "sweep whole: trial 0-lr=0.1 started on cpu" in finished.stderr  # not a terminal: a line per start and end


def test_a_failed_trial_is_said_with_its_cause_and_the_others_finish(cwd, finished):
    nan = _record(cwd, "whole")["trials"][1]
    assert nan["exit_code"] == 1 and "NaN" in nan["cause"], nan
    assert "trial 1-lr=1000000.0 failed (exit 1)" in finished.stderr and nan["cause"] in finished.stderr


def test_the_doctor_and_mgpu_runs_read_a_sweep_folder_a_line_per_trial(cwd, finished):
    doctor = cli("doctor", "runs/whole", cwd=cwd)
    assert doctor.returncode == 1, doctor.output
    lines = [line.strip() for line in doctor.stderr.splitlines() if line.strip().startswith("trial ")]
    assert len(lines) == 3 and "runs/whole/0-lr=0.1 finished." in lines[0], doctor.stderr
    assert "failed: rank 0 failed first at step" in lines[1] and "NaN" in lines[1]
    runs = cli("runs", "runs/whole", "--json", cwd=cwd)
    assert runs.returncode == 0, runs.output
    states = {r["name"]: r["status"] for r in json.loads(runs.stdout)["runs"]}
    assert states == {"0-lr=0.1": "succeeded", "1-lr=1000000.0": "failed", "2-lr=0.01": "succeeded"}


def _start_held(cwd: Path, tag: str):
    env = {**os.environ, "PYTHONUNBUFFERED": "1", TAG: tag, "MGPU_FAULT": f"hold_step@step={HELD_AT}",
           "MGPU_FAULT_SLEEP": "120"}
    out = open(cwd / "stopped.log", "w")  # noqa: SIM115 (closed below)
    proc = proctree.start([sys.executable, "-m", "mgpucli", "sweep", "--name", "stopped", *COMMON, GOOD],
                          cwd=cwd, env=env, stdout=out, stderr=out)
    return proc, out


def _logged(run_dir: Path, step: int) -> bool:
    metrics = run_dir / "metrics.jsonl"
    return metrics.exists() and f'"step": {step},' in metrics.read_text()


def test_ctrl_c_stops_every_trial_at_a_checkpoint_and_the_same_command_continues_bitwise(cwd, finished, tag):
    proc, out = _start_held(cwd, tag)
    trials = [cwd / "runs/stopped/0-lr=0.1", cwd / "runs/stopped/1-lr=0.01"]
    try:
        # both trials logged step 20 and are held in step 30: the Ctrl-C lands mid-epoch in both, whatever the load
        assert wait_until(lambda: proc.poll() is None and all(_logged(t, 20) for t in trials), timeout=120), \
            (cwd / "stopped.log").read_text()
        os.killpg(proc.pid, signal.SIGINT)  # a terminal's Ctrl-C: the sweep's process group (each trial has its own)
        assert proc.wait(timeout=90) == 75, (cwd / "stopped.log").read_text()
    finally:
        stop_tree(proc)
        out.close()
    said = (cwd / "stopped.log").read_text()
    assert "stopped: every running trial stopped at a checkpoint" in said, said
    assert [t["state"] for t in _record(cwd, "stopped")["trials"]] == ["stopped", "stopped"]
    for trial in trials:  # stopped at the step the ranks agreed on once the signal came: mid-epoch, not the end
        assert HELD_AT - 1 <= load_ckpt(trial / "checkpoints/last.pt")["step"] < 128
    again = mgpu("sweep", "--name", "stopped", *COMMON, GOOD, cwd=cwd, timeout=300)
    assert again.returncode == 0, again.output
    assert "continuing (2 stopped)" in again.stderr and "(again, from its last checkpoint: launch 2)" in again.stderr
    for name, whole in (("0-lr=0.1", "0-lr=0.1"), ("1-lr=0.01", "2-lr=0.01")):
        a = load_ckpt(cwd / "runs/stopped" / name / "checkpoints/last.pt")
        b = load_ckpt(cwd / "runs/whole" / whole / "checkpoints/last.pt")
        assert a["step"] == b["step"] == 128
        assert all(torch.equal(a["model"][k], b["model"][k]) for k in b["model"]), name
    assert not tagged(TAG, tag)


def test_a_refusal_through_the_console_script_is_exit_2_and_writes_nothing(tmp_path):
    r = mgpu("sweep", "--cpu", "quickstart", "optim.lr=0.1", cwd=tmp_path, timeout=60)
    assert_usage_error(r, "Nothing to sweep: no override has several values")
    assert list(tmp_path.iterdir()) == []


def test_an_optuna_search_runs_the_values_its_sampler_picks_and_tells_the_study(tmp_path):
    optuna = pytest.importorskip("optuna")  # the mgpu[sweep] extra; CI installs it
    r = mgpu("sweep", "--search", "optuna", "--trials", "2", "--name", "tpe", *COMMON,
             "optim.lr=tag(log, interval(1e-3,1e-1))", "trainer.max_steps=20", cwd=tmp_path, timeout=240)
    assert r.returncode == 0, r.output
    rec = _record(tmp_path, "tpe")
    assert rec["search"] == "optuna" and [t["state"] for t in rec["trials"]] == ["finished", "finished"]
    study = optuna.load_study(study_name="tpe", storage=f"sqlite:///{tmp_path}/runs/tpe/optuna.db")
    told = {t.number: t.value for t in study.trials if t.state.name == "COMPLETE"}
    for trial in rec["trials"]:
        ran = (tmp_path / "runs/tpe" / trial["name"] / "recipe.yaml").read_text()
        assert f"lr: {trial['values']['optim.lr']}" in ran  # the sampled value, exactly, in the run's recipe
        assert told[trial["search_trial"]] == trial["best"]
