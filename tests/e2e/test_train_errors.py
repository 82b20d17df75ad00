"""Bad input to `mgpu train` and `mgpu launch` that needs real processes to refuse: exit 2, one message naming the
problem and the fix, no traceback. Refused before torch is imported (a fresh process, torch blocked), reported once
under torchrun, and each class of component problem that a plain launch leaves to local rank 0's worker (a launch
each; every bad value of each class is refused in the test process by tests/unit/test_train_refusals.py, through
train, its --check and the launcher's --check, the same check).
"""

from __future__ import annotations

import json

import pytest

from tests.procs import RECIPES, assert_usage_error, mgpu, torchrun

QUICK = str(RECIPES / "quickstart.yaml")
SMALL = ["data.train.num_samples=256", "data.val.num_samples=64"]


@pytest.mark.parametrize("args, fragment", [
    (["nope.yaml"], "recipe file nope.yaml does not exist"),
    (["quickstart", "trainer.epcohs=2"], "trainer.epcohs: unknown key (did you mean 'trainer.epochs'?)"),
    (["quickstart", "trainer.epochs"], "override 'trainer.epochs' is malformed"),
])
def test_a_recipe_that_does_not_compose_is_refused_before_torch_is_imported(tmp_path, no_torch, args, fragment):
    """What the schema and the overrides refuse needs no torch: said in a fraction of a second, not after torch's
    import (seconds; more on a GPU machine's shared file system)."""
    assert_usage_error(mgpu("train", *args, cwd=tmp_path, env=no_torch), fragment)


def test_bad_input_under_torchrun_is_reported_once(tmp_path):
    r = torchrun(2, "train", QUICK, *SMALL, "data.batch_size=0", cwd=tmp_path)
    assert r.returncode != 0
    assert r.stderr.count("data.batch_size: must be >= 1") == 1, r.stderr


@pytest.mark.parametrize("override, fragments", [
    pytest.param("optim.lrr=0.1", ["optim.lrr: torch.optim.SGD takes no argument 'lrr' (did you mean 'lr'?)"],
                 id="a-component-typo"),
    pytest.param("model.dropout=2", ["model: building mgpucli.components.models.MLP failed: ValueError: dropout "
                                     "probability", "quickstart", "MGPU_DEBUG=1"], id="a-constructor-that-raises"),
    pytest.param("trainer.strategy=fsdp trainer.fsdp.wrap=[Nope]",
                 ["trainer.fsdp.wrap names 'Nope', which the model doesn't contain (its module classes: Linear, MLP, "
                  "ReLU, Sequential)"], id="a-value-the-built-model-refuses"),
])
def test_a_component_problem_local_rank_0s_worker_finds_refuses_the_launch_and_writes_nothing(tmp_path, override,
                                                                                             fragments):
    """A plain launch leaves the components to local rank 0's worker (it imports what building them needs anyway):
    the launch is still refused with exit 2 and the recipe's message, said once (never a '+' form), no worker's
    output, no run dir, no logs."""
    r = mgpu("launch", "--cpu", "--nproc", "2", "quickstart", *override.split(), cwd=tmp_path, timeout=90)
    assert_usage_error(r, *fragments)
    assert r.output.count("problem(s) in recipe") == 1 and f"+{override}" not in r.output and "[rank" not in r.output
    assert list(tmp_path.iterdir()) == []  # no run dir, no worker log, no launch record


def test_a_dataset_that_fails_in_the_workers_is_reported_as_a_recipe_problem(tmp_path):
    """The launcher leaves datasets to the workers (they may be large): every rank refuses the same recipe, the
    launch exits 2, and the post-mortem names a recipe problem, not a crash."""
    r = mgpu("launch", "--cpu", "--nproc", "2", "quickstart", "data.train.num_features=abc", cwd=tmp_path,
             timeout=120)
    assert r.returncode == 2, r.output
    assert "every rank stopped on bad input" in r.stderr and "data.train: building" in r.stderr
    doctor = mgpu("doctor", "runs/quickstart", "--json", cwd=tmp_path, timeout=60)
    report = json.loads(doctor.stdout)
    assert report["first_failure"]["signature"] == "recipe_problem", report
    assert report["first_failure"]["title"].startswith("a problem in the recipe, not a crash: data.train: building")
