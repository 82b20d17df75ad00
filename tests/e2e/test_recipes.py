"""`mgpu recipes` / show / copy, recipes by name on train, launch and validate, and `--check`: real CLI runs."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import time
import uuid

import pytest

from tests.procs import RECIPES, Result, assert_usage_error, load_ckpt, mgpu, tagged

SHIPPED = sorted(p.stem for p in RECIPES.glob("*.yaml"))
SMALL = ["data.train.num_samples=256", "data.val.num_samples=64", "trainer.epochs=1"]


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


def test_list_as_json(tmp_path):
    import importlib.util

    r = mgpu("recipes", "--json", cwd=tmp_path, timeout=30)
    assert r.returncode == 0, r.output
    found = {item["name"]: item for item in json.loads(r.stdout)["recipes"]}
    assert sorted(found) == SHIPPED
    cifar = found["cifar10-resnet18"]
    assert cifar["requires"][0]["module"] == "torchvision"
    assert cifar["requires"][0]["installed"] == (importlib.util.find_spec("torchvision") is not None)
    assert cifar["ready"] == cifar["requires"][0]["installed"]
    assert found["quickstart"] == {**found["quickstart"], "requires": [], "ready": True,
                                   "path": str(RECIPES / "quickstart.yaml")}


def test_show_prints_the_file_on_stdout(tmp_path):
    r = mgpu("recipes", "show", "charlm", cwd=tmp_path, timeout=30)
    assert r.returncode == 0, r.output
    assert r.stdout == (RECIPES / "charlm.yaml").read_text()
    assert str(RECIPES / "charlm.yaml") in r.stderr


def test_copy_then_refuse_then_force(tmp_path):
    r = mgpu("recipes", "copy", "quickstart", cwd=tmp_path, timeout=30)
    assert r.returncode == 0, r.output
    copy = tmp_path / "quickstart.yaml"
    assert copy.read_bytes() == (RECIPES / "quickstart.yaml").read_bytes()
    assert "wrote quickstart.yaml" in r.stderr and "mgpu train ./quickstart.yaml --check" in r.stderr
    assert "named quickstart (its runs go to runs/quickstart)" in r.stderr
    copy.write_text("# my edits\n")
    assert_usage_error(mgpu("recipes", "copy", "quickstart", cwd=tmp_path, timeout=30),
                       "quickstart.yaml already exists; not overwriting it", "Pass --force")
    assert copy.read_text() == "# my edits\n"
    r = mgpu("recipes", "copy", "quickstart", "--force", cwd=tmp_path, timeout=30)
    assert r.returncode == 0 and copy.read_bytes() == (RECIPES / "quickstart.yaml").read_bytes()
    (tmp_path / "conf").mkdir()
    r = mgpu("recipes", "copy", "digits", "conf", cwd=tmp_path, timeout=30)
    assert r.returncode == 0 and (tmp_path / "conf" / "digits.yaml").is_file(), r.output


def test_a_copy_is_named_after_its_file_and_trains_into_its_own_run_dir(tmp_path):
    r = mgpu("recipes", "copy", "quickstart", "my.yaml", cwd=tmp_path, timeout=30)
    assert r.returncode == 0, r.output
    assert "named my (its runs go to runs/my)" in r.stderr and "mgpu train ./my.yaml --check" in r.stderr
    text = (tmp_path / "my.yaml").read_text()
    assert "\nname: my\n" in text and text.replace("\nname: my\n", "\nname: quickstart\n") == \
        (RECIPES / "quickstart.yaml").read_text()  # comments and all, only the name changed
    r = _launch_on_two_cpus("my.yaml", "trainer.epochs=1", cwd=tmp_path, timeout=180)
    assert r.returncode == 0, r.output
    assert (tmp_path / "runs" / "my" / "checkpoints" / "last.pt").is_file()
    assert sorted(p.name for p in (tmp_path / "runs").iterdir()) == ["my"]


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
    r = mgpu("validate", "runs/quickstart/checkpoints/last.pt", "--json", cwd=tmp_path, timeout=120)
    assert r.returncode == 0 and json.loads(r.stdout)["samples"] == 1001, r.output
    # ... and the checkpoint validates against the shipped recipe by name.
    r = mgpu("validate", "runs/quickstart/checkpoints/last.pt", "--recipe", "quickstart", "data.val.num_samples=64",
             "--json", cwd=tmp_path, timeout=120)
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


@pytest.mark.parametrize("args", [["recipes", "show", "quickstrat"], ["recipes", "copy", "quickstrat"],
                                  ["train", "quickstrat"], ["launch", "--cpu", "--nproc", "2", "quickstrat"],
                                  ["train", "quickstrat", "--check"]])
def test_unknown_name_is_exit_2_with_the_names_and_a_guess(tmp_path, args):
    r = mgpu(*args, cwd=tmp_path, timeout=60)
    assert_usage_error(r, "unknown recipe 'quickstrat'", "did you mean 'quickstart'?",
                       f"Shipped recipes: {', '.join(SHIPPED)}")
    assert list(tmp_path.iterdir()) == []  # nothing written, nothing started


def test_train_by_name_from_anywhere(tmp_path):
    r = mgpu("train", "quickstart", *SMALL, cwd=tmp_path, timeout=120)
    assert r.returncode == 0, r.output
    assert (tmp_path / "runs" / "quickstart" / "checkpoints" / "last.pt").is_file()


def test_a_file_in_the_working_directory_wins_over_the_name(tmp_path):
    text = (RECIPES / "quickstart.yaml").read_text().replace("name: quickstart", "name: local")
    (tmp_path / "quickstart").write_text(text)
    r = mgpu("train", "quickstart", "--check", cwd=tmp_path, timeout=60)
    assert r.returncode == 0, r.output
    assert "name: local" in r.stdout and "ok: recipe quickstart checks out" in r.stderr


def test_train_check_prints_the_resolved_recipe_and_trains_nothing(tmp_path):
    r = mgpu("train", "digits", "optim.lr=0.01", "--check", cwd=tmp_path, timeout=60)
    assert r.returncode == 0, r.output
    assert "lr: 0.01" in r.stdout and "${seed}" not in r.stdout and r.stdout.startswith("name: digits")
    assert f"ok: shipped recipe digits ({RECIPES / 'digits.yaml'}) checks out" in r.stderr
    assert "data.train: mgpucli.components.datasets.Digits, 1438 samples, first sample (float32[64], int64[])" \
        in r.stderr
    assert "data.val: mgpucli.components.datasets.Digits, 359 samples" in r.stderr
    assert "step" not in r.stderr and list(tmp_path.iterdir()) == []  # no run dir, no training


def test_check_reports_recipe_problems_with_exit_2(tmp_path):
    r = mgpu("train", "quickstart", "trainer.epcohs=2", "--check", cwd=tmp_path, timeout=60)
    assert_usage_error(r, "1 problem(s) in recipe quickstart", "did you mean 'trainer.epochs'?")
    r = mgpu("train", "quickstart", "model._target_=mgpucli.components.models.Nope", "--check", cwd=tmp_path,
             timeout=60)
    assert_usage_error(r, "model._target_: 'mgpucli.components.models.Nope' does not import")
    r = mgpu("train", "quickstart", "data.train.split=test2", "--check", cwd=tmp_path, timeout=60)
    assert_usage_error(r, "data.train: building mgpucli.components.datasets.SyntheticClassification failed: "
                          "ValueError: split must be one of train, val, test, got 'test2'", "datasets.py:")
    assert r.stdout == "" and list(tmp_path.iterdir()) == []


def test_launch_check_uses_the_workers_overrides_and_starts_nothing(tmp_path):
    r = mgpu("launch", "--cpu", "--nproc", "2", "quickstart", "data.train.num_samples=100", "--check",
             cwd=tmp_path, timeout=60)
    assert r.returncode == 0, r.output
    assert "device: cpu" in r.stdout  # --cpu's override, as every worker gets it
    assert "data.train: mgpucli.components.datasets.SyntheticClassification, 100 samples" in r.stderr
    assert "worker" not in r.stderr and list(tmp_path.iterdir()) == []
    # On a machine without GPUs: --check of a GPU launch still checks the recipe (no device is needed).
    r = mgpu("launch", "--gpus", "4", "quickstart", "--check", cwd=tmp_path, timeout=60)
    assert r.returncode == 0 and "ok: shipped recipe quickstart" in r.stderr, r.output
    assert_usage_error(mgpu("launch", "--cpu", "quickstart", "trainer.device=cuda", "--check", cwd=tmp_path,
                            timeout=60), "--cpu conflicts with the override 'trainer.device=cuda'")
