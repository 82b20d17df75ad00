"""``mgpu runs`` on the run dirs of real launches: one finished, one stopped by SIGTERM (exit 75), one failed.

The three short 1-process launches run at once, once for the module; ``mgpu runs`` itself needs no process of its
own and runs in-process (tests/inproc.py), but for one call through the real console script, which imports none
of torch, omegaconf or hydra.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import sys
import uuid
from pathlib import Path

import pytest

from mgpucli import proctree
from tests.inproc import cli
from tests.procs import TAG, assert_usage_error, mgpu, stop_tree, tagged, wait_until

QUICK = ["--cpu", "--nproc", "1", "quickstart", "trainer.log_every=5", "trainer.cpu_threads=1"]
FINISHED_STEPS = 140  # 128 steps an epoch on 1 process: validations at steps 128 and 140
JOBS = {  # run dir under runs/: (its overrides, its faults)
    "finished": ([f"trainer.max_steps={FINISHED_STEPS}"], {}),
    "sweep/failed": (["trainer.max_steps=60"], {"MGPU_FAULT": "crash@step=12"}),
    "sweep/stopped": (["trainer.max_steps=400"], {"MGPU_FAULT": "hold_step@step=12", "MGPU_FAULT_SLEEP": "120"}),
}


def _start(cwd: Path, name: str, tag: str):
    overrides, faults = JOBS[name]
    env = {**{k: v for k, v in os.environ.items() if not k.startswith("MGPU_FAULT")}, "PYTHONUNBUFFERED": "1",
           TAG: tag, **faults}
    log = cwd / f"{name.replace('/', '-')}.log"
    with open(log, "w") as out:
        proc = proctree.start([sys.executable, "-m", "mgpucli", "launch", *QUICK, *overrides, f"run_dir=runs/{name}"],
                              cwd=cwd, env=env, stdout=out, stderr=out)
    return proc, log


@pytest.fixture(scope="module")
def root(tmp_path_factory) -> Path:
    """A folder with runs/finished and a sweep's runs/sweep/{failed,stopped}, each as its launch left it."""
    cwd = tmp_path_factory.mktemp("runs_cmd")
    (cwd / "runs" / "sweep").mkdir(parents=True)
    (cwd / "runs" / "sweep" / "sweep.json").write_text("{}")
    tag = uuid.uuid4().hex
    started = {name: _start(cwd, name, tag) for name in JOBS}
    try:
        proc, log = started["sweep/stopped"]
        metrics = cwd / "runs" / "sweep" / "stopped" / "metrics.jsonl"
        held = wait_until(lambda: proc.poll() is None and metrics.is_file() and '"step": 10,' in metrics.read_text(),
                          120)  # step 10 logged: the job is held in step 12 until the signal
        assert held, log.read_text()
        os.kill(proc.pid, signal.SIGTERM)
        codes = {name: p.wait(timeout=120) for name, (p, _) in started.items()}
        assert codes == {"finished": 0, "sweep/failed": 1, "sweep/stopped": 75}, \
            {name: log.read_text()[-2000:] for name, (_, log) in started.items()}
    finally:
        for proc, _ in started.values():
            stop_tree(proc)
        wait_until(lambda: not tagged(TAG, tag), 20)
        left = tagged(TAG, tag)
        for pid in left:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        assert not left, f"processes left behind: {left}"
    return cwd


def _listed(root: Path, *args: str) -> dict[str, dict]:
    r = cli("runs", *args, "--json", cwd=root)
    assert r.returncode == 0, r.output
    return {run["name"]: run for run in json.loads(r.stdout)["runs"]}


def test_finished_stopped_and_failed_runs_have_the_doctors_states(root):
    runs = _listed(root)
    assert list(runs) == ["finished", "sweep/failed", "sweep/stopped"]  # the sweep's folder is no run
    done, failed, stopped = runs["finished"], runs["sweep/failed"], runs["sweep/stopped"]
    assert (done["status"], done["exit_code"], done["step"], done["cause"]) == ("succeeded", 0, FINISHED_STEPS, None)
    assert (stopped["status"], stopped["exit_code"], stopped["cause"]) == ("preempted", 75, None)
    assert stopped["step"] >= 12 and "--resume auto" in stopped["verdict"]
    assert (failed["status"], failed["exit_code"], failed["step"]) == ("failed", 1, 10)
    assert "injected fault: crash at step 12" in failed["cause"] and "failed first" in failed["verdict"]
    assert all(run["launched"] and run["seconds"] > 0 for run in runs.values())


def test_the_best_validation_metric_is_the_recipes(root):
    done = _listed(root)["finished"]
    records = [json.loads(line) for line in (root / "runs/finished/metrics.jsonl").read_text().splitlines()]
    validations = [r for r in records if r["split"] == "val"]
    assert [v["step"] for v in validations] == [128, FINISHED_STEPS]
    best = max(validations, key=lambda v: v["accuracy"])  # quickstart's trainer.best_metric, mode auto: max
    assert (done["metric"], done["mode"], done["best"], done["best_step"]) == ("accuracy", "max", best["accuracy"],
                                                                               best["step"])
    assert done["last_val"] == validations[-1] and done["val_metrics"] == ["accuracy", "loss"]


def test_sort_by_a_metric_puts_runs_without_it_last(root):
    assert list(_listed(root, "--sort", "loss")) == ["finished", "sweep/failed", "sweep/stopped"]
    assert list(_listed(root, "--sort", "step")) == ["finished", "sweep/stopped", "sweep/failed"]


def test_the_table_names_each_state_and_the_plot_draws(root):
    r = cli("runs", "--plot", "loss", cwd=root, env={"COLUMNS": "160"})
    assert r.returncode == 0, r.output
    for name, state in (("finished", "succeeded"), ("sweep/failed", "failed"), ("sweep/stopped", "preempted")):
        assert any(name in line and state in line for line in r.stdout.splitlines()), (name, r.stdout)
    assert "--resume auto continues it" in r.stdout and "RuntimeError" in r.stdout, r.stdout
    plot = r.stdout[r.stdout.index("val loss"):]
    assert "┤" in plot and "finished" in plot and "step" in plot
    assert "not drawn): sweep/failed, sweep/stopped" in r.stderr  # neither validated before it ended


def test_the_console_script_lists_without_torch_and_refuses_a_missing_dir(root, no_heavy_imports):
    r = mgpu("runs", "runs", "--plot", "accuracy", cwd=root, env=no_heavy_imports, timeout=60)
    assert r.returncode == 0 and "succeeded" in r.stdout and "val accuracy" in r.stdout, r.output
    assert_usage_error(mgpu("runs", "nowhere", cwd=root, env=no_heavy_imports, timeout=60),
                       "nowhere: no such directory")
