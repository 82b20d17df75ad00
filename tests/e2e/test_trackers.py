"""Experiment trackers for real: the official W&B and MLflow clients, offline (no network), under ``mgpu launch``.

W&B runs in offline mode (``WANDB_MODE=offline``, no credentials) and its files are read back with its own reader
(``wandb leet inspect --json``); MLflow writes to its default store, SQLite in the run dir, read back with
``mlflow.search_runs`` in a child process. Launches are tagged, bounded and cleaned up as in tests/e2e/test_launch.py.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from mgpucli.run_records import step_anatomy
from tests.e2e.test_launch import (
    RECIPE,
    SHORT,
    Launch,
    _module_probe,
    rank0_log,
    run_launch,
    wait_until,
)
from tests.e2e.test_trainer_features import rank_progress
from tests.inproc import COMPOSE_CHILD, cli
from tests.procs import assert_usage_error, mgpu

pytest.importorskip("wandb")
pytest.importorskip("mlflow")

TRACKER_MODULES = ("wandb", "mlflow")


def offline_env(tmp_path: Path) -> dict[str, str]:
    """W&B offline, silent, without credentials, its own files under tmp_path; MLflow's default store."""
    home = tmp_path / "wandb-home"
    return {"WANDB_MODE": "offline", "WANDB_SILENT": "true", "WANDB_API_KEY": "", "NETRC": str(tmp_path / "no-netrc"),
            "WANDB_CONFIG_DIR": str(home / "config"), "WANDB_CACHE_DIR": str(home / "cache"),
            "WANDB_DATA_DIR": str(home / "data"), "MLFLOW_TRACKING_URI": ""}


def records(run_dir: Path, split: str | None = None) -> list[dict]:
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    out = [json.loads(line) for line in lines if line.strip()]
    return [r for r in out if split is None or r["split"] == split]


def metric_values(run_dir: Path) -> dict[tuple[str, int], set[float]]:
    """metrics.jsonl as the trackers get it: ``{("train/loss", step): {value, ...}}`` (a step recorded twice, before
    and after a restart from an earlier checkpoint, has two values; a tracker holds one of them)."""
    values: dict[tuple[str, int], set[float]] = {}
    for r in records(run_dir):
        if r["split"] in ("train", "val"):
            for k, v in r.items():
                if k not in ("split", "step", "time", step_anatomy.KEY):
                    values.setdefault((f"{r['split']}/{k}", r["step"]), set()).add(float(v))
            for k, v in step_anatomy.scalars(r).items():  # each rank's step anatomy: anatomy/rank1/data...
                values.setdefault((k, r["step"]), set()).add(v)
    return values


def metric_rows(run_dir: Path) -> dict[int, dict[str, float]]:
    """metrics.jsonl as rows of tracker metrics, ``{step: {"train/loss": ..., "val/accuracy": ...}}``, for a run
    that recorded every step once."""
    rows: dict[int, dict[str, float]] = {}
    for (key, step), values in metric_values(run_dir).items():
        (value,) = values
        rows.setdefault(step, {})[key] = value
    return dict(sorted(rows.items()))


def wandb_parts(run_dir: Path, env: dict[str, str]) -> list[dict]:
    """Every offline run directory under the run dir, oldest first, read with W&B's own reader: its run id, history
    rows ``{step: {metric: value}}`` and exit code."""
    parts = []
    for path in sorted((run_dir / "wandb").glob("offline-run-*/run-*.wandb")):
        done = subprocess.run([sys.executable, "-m", "wandb", "leet", "inspect", "--json", str(path)],
                              capture_output=True, text=True, timeout=120, env={**os.environ, **env},
                              stdin=subprocess.DEVNULL)
        assert done.returncode == 0, done.stderr
        part: dict = {"dir": path.parent.name, "rows": {}, "exit_code": None}
        for line in done.stdout.splitlines():
            rec = json.loads(line)
            if rec["type"] == "run":
                part["id"] = rec["run"]["run_id"]
            elif rec["type"] == "history":
                part["rows"][rec["history"]["step"]["num"]] = {
                    k: v for k, v in rec["history"]["item"].items() if not k.startswith("_")}
            elif rec["type"] == "exit":
                part["exit_code"] = rec["exit"].get("exit_code", 0)
        parts.append(part)
    return parts


def mlflow_runs(uri: str, experiment: str, tmp_path: Path) -> list[dict]:
    """``mlflow.search_runs`` in a child process: each run's id, status, params and full metric histories."""
    script = (
        "import json, sys, mlflow\n"
        "from mlflow.tracking import MlflowClient\n"
        "mlflow.set_tracking_uri(sys.argv[1])\n"
        "client = MlflowClient(sys.argv[1])\n"
        "out = []\n"
        "for run in mlflow.search_runs(experiment_names=[sys.argv[2]], output_format='list'):\n"
        "    history = {k: [(m.step, m.value) for m in client.get_metric_history(run.info.run_id, k)]\n"
        "               for k in run.data.metrics}\n"
        "    out.append({'id': run.info.run_id, 'status': run.info.status, 'params': run.data.params,\n"
        "                'tags': run.data.tags, 'history': history})\n"
        "print(json.dumps(out))\n")
    done = subprocess.run([sys.executable, "-c", script, uri, experiment], capture_output=True, text=True,
                          timeout=120, cwd=tmp_path, stdin=subprocess.DEVNULL)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.splitlines()[-1])


def assert_no_tracker_on_rank_1(tmp_path: Path, tracker: str) -> None:
    rank0 = set((tmp_path / "modules-rank0.txt").read_text().split())
    rank1 = set((tmp_path / "modules-rank1.txt").read_text().split())
    assert tracker in rank0, "rank 0 logs to the tracker"
    assert not {m for m in rank1 if m.split(".")[0] in TRACKER_MODULES}, "only rank 0 imports a tracker"
    assert "mgpucli.engine.tracking" not in rank1


# --------------------------------------------------------------------------------------------------- W&B
def test_wandb_offline_run_holds_every_record_and_a_resume_after_sigterm_continues_it(
        tmp_path: Path, tag: str):
    run_dir = tmp_path / "run"
    env = offline_env(tmp_path)
    # 3 epochs of 16 steps (2 x 32 of 1024 samples)
    args = ["--cpu", "--nproc", "2", RECIPE, "trainer.loggers=[wandb]", "data.train.num_samples=1024",
            "data.val.num_samples=301", "trainer.epochs=3", "trainer.log_every=5", "trainer.cpu_threads=1",
            f"run_dir={run_dir}"]
    # rank 0 holds in step 20 until the signal reaches it: the SIGTERM lands mid-run whatever the machine's speed
    first = Launch(args, tmp_path, tag, {**env, "MGPU_FAULT": "hold_step@rank=0@step=20", "MGPU_FAULT_SLEEP": "300",
                                         **_module_probe(tmp_path)})
    try:
        def held() -> bool:
            assert first.proc.poll() is None, first.output
            return (rank_progress(run_dir, 0) or {}).get("step") == 20

        assert wait_until(held, 90), first.output
        os.kill(first.pid, signal.SIGTERM)  # what a scheduler sends the job
        code = first.wait(timeout=90)
    finally:
        first.cleanup()
    assert code == 75, first.output
    assert_no_tracker_on_rank_1(tmp_path, "wandb")
    state = json.loads((run_dir / "trackers.json").read_text())["wandb"]
    assert state["mode"] == "offline" and state["status"] == "preempted", state
    run_id = state["id"]
    assert f"wandb sync {run_dir / 'wandb'}/offline-run-*-{run_id}" in first.output  # said once, with the command
    assert first.output.count("W&B: offline run") == 1
    (part,) = wandb_parts(run_dir, env)  # exactly one offline run, under the run dir
    assert part["id"] == run_id and part["dir"].endswith(f"-{run_id}") and part["exit_code"] == 75
    assert part["rows"] == metric_rows(run_dir), "the same names, values and steps as metrics.jsonl"

    code, again = run_launch([*args, "--resume", "auto"], tmp_path, tag, env, timeout=180, name="resume")
    assert code == 0, again.output
    assert "W&B: offline continuing run " + run_id in again.output
    parts = wandb_parts(run_dir, env)
    assert [p["id"] for p in parts] == [run_id, run_id] and [p["exit_code"] for p in parts] == [75, 0]
    steps = [step for p in parts for step in p["rows"]]
    assert steps == sorted(set(steps)), "a resumed run appends: its steps never go backwards"
    assert {**parts[0]["rows"], **parts[1]["rows"]} == metric_rows(run_dir)
    assert records(run_dir, "val")[-1]["step"] == steps[-1] == 3 * 16
    assert json.loads((run_dir / "trackers.json").read_text())["wandb"]["status"] == "finished"


# ------------------------------------------------------------------------------------------------ MLflow
def test_mlflow_run_has_the_recipe_and_every_metric_and_a_restart_continues_it(
        tmp_path: Path, tag: str):
    run_dir = tmp_path / "run"
    env = {**offline_env(tmp_path), "MGPU_FAULT": "crash@rank=1@step=30", "MGPU_FAULT_ONCE": str(tmp_path / "fired"),
           **_module_probe(tmp_path)}
    # a crash at step 30 after the checkpoint at step 20, with records every 5 steps: the restart resumes at 20 and
    # meets steps 25 (logged before the crash) again
    code, launch = run_launch(["--cpu", "--nproc", "2", "--max-restarts", "1", RECIPE, *SHORT, "trainer.log_every=5",
                               "trainer.loggers=[tensorboard,mlflow]", "optim.lr=0.04", f"run_dir={run_dir}"],
                              tmp_path, tag, env, timeout=240)
    assert code == 0, launch.output
    assert (tmp_path / "fired").exists()
    assert "resumed from" in rank0_log(run_dir, attempt=1).read_text()
    assert_no_tracker_on_rank_1(tmp_path, "mlflow")
    assert list((run_dir / "tensorboard").glob("events.out.tfevents.*"))  # the other sink still writes
    state = json.loads((run_dir / "trackers.json").read_text())["mlflow"]
    assert state["tracking_uri"] == f"sqlite:///{run_dir.resolve()}/mlflow.db" and state["status"] == "finished"

    (run,) = mlflow_runs(state["tracking_uri"], "quickstart", tmp_path)  # one run across both attempts
    assert run["id"] == state["id"] and run["status"] == "FINISHED"
    assert run["params"]["optim.lr"] == "0.04" and run["params"]["trainer.log_every"] == "5"
    assert run["params"]["model._target_"] == "mgpucli.components.models.MLP"
    assert run["tags"]["mgpu.world_size"] == "2" and run["tags"]["mgpu.device"] == "cpu"
    assert run["tags"]["mgpu.checkpoint.last"] == str((run_dir / "checkpoints" / "last.pt").resolve())
    expected = metric_values(run_dir)
    assert set(run["history"]) == {key for key, _ in expected}
    for key, history in run["history"].items():
        steps = [step for step, _ in history]
        assert steps == sorted(set(steps)), f"{key}: steps increase, none twice"
        assert set(steps) == {step for k, step in expected if k == key}, f"{key}: every step metrics.jsonl has"
        assert all(value in expected[(key, step)] for step, value in history), key
    twice = [r["step"] for r in records(run_dir, "train")]
    assert len(twice) > len(set(twice))  # metrics.jsonl has the replayed steps; the tracker has each once


# ---------------------------------------------------------------------------------------- not installed
def _blocker(tmp_path: Path) -> dict[str, str]:
    """A PYTHONPATH where importing wandb or mlflow fails as it does where they are not installed."""
    blocker = tmp_path / "blocker"
    for name in TRACKER_MODULES:
        (blocker / name).mkdir(parents=True)
        (blocker / name / "__init__.py").write_text(
            f"raise ModuleNotFoundError(\"No module named '{name}'\", name={name!r})\n")
    return {"PYTHONPATH": str(blocker)}


def test_a_tracker_that_is_not_installed_is_exit_2_before_any_worker(
        tmp_path: Path, tag: str):
    env = {**offline_env(tmp_path), **_blocker(tmp_path)}
    code, launch = run_launch(["--cpu", "--nproc", "2", "quickstart", "trainer.loggers=[wandb]"], tmp_path, tag, env,
                              timeout=60)
    assert code == 2, launch.output
    assert "Traceback" not in launch.output and launch.output.count("problem(s) in recipe") == 1
    assert "trainer.loggers: wandb: wandb is not installed" in launch.output
    assert "pip install 'mgpu[wandb]'" in launch.output
    assert not (tmp_path / "runs").exists()  # nothing started, nothing written
    # the same recipe check, through the real console script, for each tracker (the test process has both)
    r = mgpu("launch", "--cpu", "--nproc", "2", "quickstart", "trainer.loggers=[wandb,mlflow]", "--check",
             cwd=tmp_path, env=env, timeout=60)
    assert_usage_error(r, "trainer.loggers: wandb:", "trainer.loggers: mlflow:", "pip install 'mgpu[wandb]'",
                       "pip install 'mgpu[mlflow]'")
    r = mgpu("train", "quickstart", "trainer.loggers=[wandb]", cwd=tmp_path, env=env, timeout=60)
    assert_usage_error(r, "trainer.loggers: wandb:", "pip install 'mgpu[wandb]'")
    r = cli("launch", "--cpu", "--nproc", "2", "quickstart", "trainer.loggers=[wandbb]", cwd=tmp_path,
            allowed=(COMPOSE_CHILD,))
    assert_usage_error(r, "trainer.loggers: 'wandbb' is not a logger mgpu knows (did you mean 'wandb'?")
    assert not (tmp_path / "runs").exists()


# ------------------------------------------------------------------------------------- failing mid-run
def test_a_tracker_that_fails_mid_run_warns_once_and_training_finishes(
        tmp_path: Path, tag: str):
    run_dir = tmp_path / "run"
    env = {**offline_env(tmp_path), "MGPU_FAULT": "tracker@step=40"}
    code, launch = run_launch(["--cpu", "--nproc", "2", RECIPE, *SHORT, "trainer.loggers=[wandb]",
                               f"run_dir={run_dir}"], tmp_path, tag, env, timeout=180)
    assert code == 0, launch.output
    assert launch.output.count("W&B failed while logging step 40") == 1, launch.output
    assert (run_dir / "checkpoints" / "last.pt").is_file()
    assert records(run_dir, "val")[-1]["step"] == 64  # training went on to the end
    (event,) = records(run_dir, "event")
    assert event["tracker"] == "wandb" and event["step"] == 40 and "injected fault" in event["error"]
    (part,) = wandb_parts(run_dir, offline_env(tmp_path))
    assert sorted(part["rows"]) == [20]  # what it got before it failed

    done = subprocess.run([sys.executable, "-m", "mgpucli", "doctor", str(run_dir)], cwd=tmp_path, capture_output=True,
                          text=True, timeout=60, stdin=subprocess.DEVNULL)
    assert done.returncode == 0, done.stderr  # the run finished
    assert "W&B run" in done.stderr and "failed while logging step 40" in done.stderr, done.stderr
    report = json.loads((run_dir / "postmortem.json").read_text())
    assert report["trackers"]["wandb"]["failures"][0]["step"] == 40
