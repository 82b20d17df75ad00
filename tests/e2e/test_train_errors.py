"""Every bad input to `mgpu train`: exit 2, one message naming the problem and the fix, no traceback."""

from __future__ import annotations

import pytest
import torch

from tests.procs import RECIPES, assert_usage_error, mgpu, torchrun

QUICK = str(RECIPES / "quickstart.yaml")
SMALL = ["data.train.num_samples=256", "data.val.num_samples=64"]


@pytest.mark.parametrize("overrides, fragments", [
    (["trainer.epcohs=2"], ["trainer.epcohs: unknown key (did you mean 'trainer.epochs'?)", "quickstart.yaml"]),
    (["trainer.epochs=many"], ["trainer.epochs: Value 'many' of type 'str' could not be converted to Integer"]),
    (["~optim"], ["optim: missing required section"]),
    (["model._target_=mgpucli.components.models.Nope"], ["model._target_: 'mgpucli.components.models.Nope' "
                                                         "does not import"]),
    (["model._target_=mgpucli.__version__"], ["'mgpucli.__version__' is str, not something callable"]),
    (["+model.width=3"], ["model.width: mgpucli.components.models.MLP takes no argument 'width' (it takes "
                          "in_features, out_features, hidden, dropout)"]),
    (["~model.in_features"], ["model: arguments don't fit", "in_features"]),
    (["trainer.epochs"], ["override 'trainer.epochs' is malformed"]),
    (["data.batch_size=0"], ["data.batch_size: must be >= 1, got 0"]),
    (["trainer.strategy=dp"], ["trainer.strategy=dp (nn.DataParallel) needs CUDA GPUs", "trainer.strategy=ddp"]),
    (["data.train.num_samples=20"], ["data.train has 20 samples: too few for one batch of 32"]),
])
def test_bad_recipe_values(tmp_path, overrides, fragments):
    assert_usage_error(mgpu("train", QUICK, *SMALL, *overrides, cwd=tmp_path), *fragments)
    assert not (tmp_path / "runs" / "quickstart" / "checkpoints").exists() or "strategy" in overrides[0] \
        or "num_samples" in overrides[0]


@pytest.mark.parametrize("command", [["train"], ["train", "--check"], ["launch", "--cpu", "--nproc", "2"],
                                     ["launch", "--cpu", "--nproc", "2", "--check"]])
@pytest.mark.parametrize("override", ["optim.lrr=0.1", "+optim.lrr=0.1"])
def test_a_component_typo_gets_the_signatures_did_you_mean_and_never_a_plus(tmp_path, command, override):
    r = mgpu(*command, "quickstart", override, cwd=tmp_path, timeout=60)
    assert_usage_error(r, "optim.lrr: torch.optim.SGD takes no argument 'lrr' (did you mean 'lr'?)")
    assert "+optim.lrr" not in r.output and r.output.count("problem(s) in recipe") == 1
    assert list(tmp_path.iterdir()) == []  # no run dir, no logs: nothing started


def test_a_component_argument_the_recipe_leaves_out_is_set_with_key_value(tmp_path):
    r = mgpu("train", "quickstart", "optim.weight_decay=0.01", "--check", cwd=tmp_path, timeout=60)
    assert r.returncode == 0 and "weight_decay: 0.01" in r.stdout, r.output


def test_missing_recipe_file(tmp_path):
    assert_usage_error(mgpu("train", "nope.yaml", cwd=tmp_path), "recipe file nope.yaml does not exist")


def test_yaml_syntax_error_names_the_line(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: x\ntrainer:\n  epochs: [1\n")
    assert_usage_error(mgpu("train", str(bad), cwd=tmp_path), "YAML syntax error at line")


def test_resume_path_missing(tmp_path):
    assert_usage_error(mgpu("train", QUICK, *SMALL, "--resume", "gone.pt", cwd=tmp_path),
                       "--resume gone.pt: no such checkpoint", "--resume auto")


def test_resume_from_something_that_is_not_an_mgpu_checkpoint(tmp_path):
    torch.save({"weight": torch.zeros(2)}, tmp_path / "plain.pt")
    assert_usage_error(mgpu("train", QUICK, *SMALL, "--resume", "plain.pt", cwd=tmp_path),
                       "plain.pt is not an mgpu checkpoint")


def test_resume_into_a_model_that_does_not_fit(tmp_path):
    assert mgpu("train", QUICK, *SMALL, "trainer.max_steps=2", cwd=tmp_path).returncode == 0
    r = mgpu("train", QUICK, *SMALL, "model.hidden=[32]", "--resume", "auto", cwd=tmp_path)
    assert_usage_error(r, "don't fit the recipe's model", "shape mismatch", "net.0.weight (checkpoint (64, 32), "
                       "model (32, 32))", "unexpected in the checkpoint (2): net.4.weight, net.4.bias")


def test_run_dir_that_cannot_be_created(tmp_path):
    (tmp_path / "afile").write_text("x")
    assert_usage_error(mgpu("train", QUICK, *SMALL, "run_dir=afile/run", cwd=tmp_path),
                       "cannot create run dir afile/run: afile is a file", "run_dir=PATH")


def test_bad_input_under_torchrun_is_reported_once(tmp_path):
    r = torchrun(2, "train", QUICK, *SMALL, "data.batch_size=0", cwd=tmp_path)
    assert r.returncode != 0
    assert r.stderr.count("data.batch_size: must be >= 1") == 1, r.stderr
