"""`mgpu recipes` / show / copy, recipes by name on train, launch and validate, and `--check`, run in the test process
(tests/inproc.py): what starts no process. The list without torch, a launch by name on two processes and a refusal
through the console script are in tests/e2e/test_recipes.py.
"""

from __future__ import annotations

import json

import pytest

from tests.inproc import COMPOSE_CHILD, cli
from tests.procs import RECIPES, assert_usage_error

SHIPPED = sorted(p.stem for p in RECIPES.glob("*.yaml"))
SMALL = ["data.train.num_samples=256", "data.val.num_samples=64", "trainer.epochs=1"]


def mgpu_here(*args: str, cwd):
    """``mgpu ARGS`` in the test process; a launch may compose its recipe in its compose child."""
    return cli(*args, cwd=cwd, allowed=(COMPOSE_CHILD,))


def test_list_as_json(tmp_path):
    import importlib.util

    r = mgpu_here("recipes", "--json", cwd=tmp_path)
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
    r = mgpu_here("recipes", "show", "charlm", cwd=tmp_path)
    assert r.returncode == 0, r.output
    assert r.stdout == (RECIPES / "charlm.yaml").read_text()
    assert str(RECIPES / "charlm.yaml") in r.stderr


def test_copy_then_refuse_then_force(tmp_path):
    r = mgpu_here("recipes", "copy", "quickstart", cwd=tmp_path)
    assert r.returncode == 0, r.output
    copy = tmp_path / "quickstart.yaml"
    assert copy.read_bytes() == (RECIPES / "quickstart.yaml").read_bytes()
    assert "wrote quickstart.yaml" in r.stderr and "mgpu train ./quickstart.yaml --check" in r.stderr
    assert "named quickstart (its runs go to runs/quickstart)" in r.stderr
    copy.write_text("# my edits\n")
    assert_usage_error(mgpu_here("recipes", "copy", "quickstart", cwd=tmp_path),
                       "quickstart.yaml already exists; not overwriting it", "Pass --force")
    assert copy.read_text() == "# my edits\n"
    r = mgpu_here("recipes", "copy", "quickstart", "--force", cwd=tmp_path)
    assert r.returncode == 0 and copy.read_bytes() == (RECIPES / "quickstart.yaml").read_bytes()
    (tmp_path / "conf").mkdir()
    r = mgpu_here("recipes", "copy", "digits", "conf", cwd=tmp_path)
    assert r.returncode == 0 and (tmp_path / "conf" / "digits.yaml").is_file(), r.output


def test_a_copy_is_named_after_its_file_and_trains_into_its_own_run_dir(tmp_path):
    r = mgpu_here("recipes", "copy", "quickstart", "my.yaml", cwd=tmp_path)
    assert r.returncode == 0, r.output
    assert "named my (its runs go to runs/my)" in r.stderr and "mgpu train ./my.yaml --check" in r.stderr
    text = (tmp_path / "my.yaml").read_text()
    assert "\nname: my\n" in text and text.replace("\nname: my\n", "\nname: quickstart\n") == \
        (RECIPES / "quickstart.yaml").read_text()  # comments and all, only the name changed
    r = mgpu_here("train", "my.yaml", *SMALL, cwd=tmp_path)
    assert r.returncode == 0, r.output
    assert (tmp_path / "runs" / "my" / "checkpoints" / "last.pt").is_file()
    assert sorted(p.name for p in (tmp_path / "runs").iterdir()) == ["my"]


@pytest.mark.parametrize("args", [["recipes", "copy", "quickstrat"],
                                  ["train", "quickstrat"], ["launch", "--cpu", "--nproc", "2", "quickstrat"],
                                  ["train", "quickstrat", "--check"]])
def test_unknown_name_is_exit_2_with_the_names_and_a_guess(tmp_path, args):
    r = mgpu_here(*args, cwd=tmp_path)
    assert_usage_error(r, "unknown recipe 'quickstrat'", "did you mean 'quickstart'?",
                       f"Shipped recipes: {', '.join(SHIPPED)}")
    assert list(tmp_path.iterdir()) == []  # nothing written, nothing started


def test_train_by_name_from_anywhere(tmp_path):
    r = mgpu_here("train", "quickstart", *SMALL, cwd=tmp_path)
    assert r.returncode == 0, r.output
    assert (tmp_path / "runs" / "quickstart" / "checkpoints" / "last.pt").is_file()


def test_a_file_in_the_working_directory_wins_over_the_name(tmp_path):
    text = (RECIPES / "quickstart.yaml").read_text().replace("name: quickstart", "name: local")
    (tmp_path / "quickstart").write_text(text)
    r = mgpu_here("train", "quickstart", "--check", cwd=tmp_path)
    assert r.returncode == 0, r.output
    assert "name: local" in r.stdout and "ok: recipe quickstart checks out" in r.stderr


def test_train_check_prints_the_resolved_recipe_and_trains_nothing(tmp_path):
    r = mgpu_here("train", "digits", "optim.lr=0.01", "--check", cwd=tmp_path)
    assert r.returncode == 0, r.output
    assert "lr: 0.01" in r.stdout and "${seed}" not in r.stdout and r.stdout.startswith("name: digits")
    assert f"ok: shipped recipe digits ({RECIPES / 'digits.yaml'}) checks out" in r.stderr
    assert "data.train: mgpucli.components.datasets.Digits, 1438 samples, first sample (float32[64], int64[])" \
        in r.stderr
    assert "data.val: mgpucli.components.datasets.Digits, 359 samples" in r.stderr
    assert "step" not in r.stderr and list(tmp_path.iterdir()) == []  # no run dir, no training


def test_check_reports_recipe_problems_with_exit_2(tmp_path):
    r = mgpu_here("train", "quickstart", "trainer.epcohs=2", "--check", cwd=tmp_path)
    assert_usage_error(r, "1 problem(s) in recipe quickstart", "did you mean 'trainer.epochs'?")
    r = mgpu_here("train", "quickstart", "model._target_=mgpucli.components.models.Nope", "--check", cwd=tmp_path)
    assert_usage_error(r, "model._target_: 'mgpucli.components.models.Nope' does not import")
    r = mgpu_here("train", "quickstart", "data.train.split=test2", "--check", cwd=tmp_path)
    assert_usage_error(r, "data.train: building mgpucli.components.datasets.SyntheticClassification failed: "
                          "ValueError: split must be one of train, val, test, got 'test2'", "datasets.py:")
    assert r.stdout == "" and list(tmp_path.iterdir()) == []


def test_launch_check_uses_the_workers_overrides_and_starts_nothing(tmp_path):
    r = mgpu_here("launch", "--cpu", "--nproc", "2", "quickstart", "data.train.num_samples=100", "--check",
                  cwd=tmp_path)
    assert r.returncode == 0, r.output
    assert "device: cpu" in r.stdout  # --cpu's override, as every worker gets it
    assert "data.train: mgpucli.components.datasets.SyntheticClassification, 100 samples" in r.stderr
    assert "worker" not in r.stderr and list(tmp_path.iterdir()) == []
    # On a machine without GPUs: --check of a GPU launch still checks the recipe (no device is needed).
    r = mgpu_here("launch", "--gpus", "4", "quickstart", "--check", cwd=tmp_path)
    assert r.returncode == 0 and "ok: shipped recipe quickstart" in r.stderr, r.output
    assert_usage_error(mgpu_here("launch", "--cpu", "quickstart", "trainer.device=cuda", "--check", cwd=tmp_path),
                       "--cpu conflicts with the override 'trainer.device=cuda'")
