"""`mgpu recipes` and recipes by name through the real CLI: the list without torch, a launch by name on two CPU
processes, an unknown name refused through the console script. What starts no process (show, copy, --check, train
and validate by name) runs in the test process: tests/unit/test_recipes_cli.py.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import time
import uuid

import pytest

from tests.inproc import cli
from tests.procs import RECIPES, Result, assert_usage_error, load_ckpt, mgpu, tagged

SHIPPED = sorted(p.stem for p in RECIPES.glob("*.yaml"))


def test_list_names_descriptions_needs_and_installed_without_torch(tmp_path, no_heavy_imports):
    r = mgpu("recipes", cwd=tmp_path, env=no_heavy_imports, timeout=30)
    assert r.returncode == 0, r.output
    for name in SHIPPED:  # the list is the output: on stdout, for `mgpu recipes | grep ...`
        assert f"  {name} " in r.stdout
    assert "Synthetic 4-class classification with an MLP" in r.stdout  # quickstart's description: line
    assert "needs: the examples extra (scikit-learn), installed" in r.stdout  # digits; scikit-learn is a dev dep
    assert [line.split()[0] for line in r.stdout.splitlines() if "quick" in line] == ["quickstart"]  # | grep quick
    assert "mgpu train quickstart" in r.stderr and "Run one by name" not in r.stdout  # the notes on stderr
    assert "must not be imported" not in r.output


def test_launch_by_name_on_two_cpu_processes_and_its_schedule_spans_the_run(tmp_path):
    """${total_steps:}: 1024 samples, batch 32, 2 processes, 6 epochs = 96 steps; one cosine from the initial
    rate down to its minimum at the run's last step (the launcher hands the recipe to its workers unresolved)."""
    r = _launch_on_two_cpus("quickstart", "data.train.num_samples=1024", "trainer.epochs=6", cwd=tmp_path,
                            timeout=240)
    assert r.returncode == 0, r.output
    run_dir = tmp_path / "runs" / "quickstart"
    trains = [m for m in map(json.loads, (run_dir / "metrics.jsonl").read_text().splitlines())
              if m["split"] == "train"]
    lrs = [m["lr"] for m in trains]
    assert trains[-1]["step"] == 96 and lrs[-1] == pytest.approx(0.0, abs=1e-9)
    assert all(a >= b for a, b in zip(lrs, lrs[1:], strict=False)) and min(lrs[:-1]) > 1e-6  # down once, to the end
    assert "  T_max: 96\n" in (run_dir / "recipe.yaml").read_text()
    last = load_ckpt(run_dir / "checkpoints" / "last.pt")
    assert "  T_max: 96\n" in last["recipe"] and last["world_size"] == 2
    r = cli("validate", "runs/quickstart/checkpoints/last.pt", "--json", cwd=tmp_path)
    assert r.returncode == 0 and json.loads(r.stdout)["samples"] == 1001, r.output
    # ... and the checkpoint validates against the shipped recipe by name.
    r = cli("validate", "runs/quickstart/checkpoints/last.pt", "--recipe", "quickstart", "data.val.num_samples=64",
            "--json", cwd=tmp_path)
    assert r.returncode == 0, r.output
    assert json.loads(r.stdout)["samples"] == 64


def _launch_on_two_cpus(*args: str, cwd, timeout: float) -> Result:
    """``mgpu launch --cpu --nproc 2 ...`` with every process it starts tagged; fails the test if any is left
    behind (after a little wait for exits to finish), killing those by pid."""
    tag = uuid.uuid4().hex
    try:
        return mgpu("launch", "--cpu", "--nproc", "2", *args, cwd=cwd, env={"MGPU_E2E_TAG": tag}, timeout=timeout)
    finally:
        deadline = time.monotonic() + 20
        while tagged("MGPU_E2E_TAG", tag) and time.monotonic() < deadline:
            time.sleep(0.1)
        left = tagged("MGPU_E2E_TAG", tag)
        for pid in left:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
        assert not left, f"processes left behind: {left}"


def test_unknown_name_is_exit_2_with_the_names_and_a_guess_through_the_console_script(tmp_path):
    """The other commands' refusal of an unknown name: tests/unit/test_recipes_cli.py."""
    r = mgpu("recipes", "show", "quickstrat", cwd=tmp_path, timeout=60)
    assert_usage_error(r, "unknown recipe 'quickstrat'", "did you mean 'quickstart'?",
                       f"Shipped recipes: {', '.join(SHIPPED)}")
    assert list(tmp_path.iterdir()) == []  # nothing written, nothing started
