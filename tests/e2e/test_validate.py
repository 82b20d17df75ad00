"""End-to-end: `mgpu validate` on real checkpoints, 1 and 2 CPU processes, and every bad input.

The checkpoint is trained once (a real `mgpu train`) and read by every test. What shows processes stays on real ones
(the same metrics on 1 and 2 processes, a DDP run's BatchNorm statistics, a refusal through the console script);
the other validations and refusals run in the test process (tests/inproc.py), which starts none.
"""

from __future__ import annotations

import json
import os
import pickle
import random

import pytest
import torch

from tests.inproc import cli
from tests.procs import RECIPES, assert_usage_error, load_ckpt, mgpu

QUICK = str(RECIPES / "quickstart.yaml")
VAL = 333  # not a multiple of 2 x batch size: the last batch is partial and ranks get unequal shares
CKPT = "runs/quickstart/checkpoints/last.pt"


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    cwd = tmp_path_factory.mktemp("validate")
    r = mgpu("train", QUICK, "data.train.num_samples=512", f"data.val.num_samples={VAL}", "trainer.epochs=1",
             cwd=cwd)
    assert r.returncode == 0, r.output
    return cwd


def validate(cwd, *args):
    """``mgpu validate ARGS`` in the test process: a 1-process validation or a refusal starts no process."""
    return cli("validate", *args, cwd=cwd)


def validate_in_processes(cwd, *args):
    """``mgpu validate ARGS`` through the real console script, in processes of its own."""
    return mgpu("validate", *args, cwd=cwd, timeout=120)


def test_identical_metrics_on_one_and_two_processes(trained):
    one = validate_in_processes(trained, CKPT, "trainer.cpu_threads=1", "--json")
    two = validate_in_processes(trained, CKPT, "trainer.cpu_threads=1", "--cpu", "--nproc", "2", "--json")
    assert one.returncode == 0 and two.returncode == 0, one.output + two.output
    a, b = json.loads(one.stdout), json.loads(two.stdout)  # stdout holds exactly one JSON object
    assert a["metrics"] == b["metrics"]  # bitwise: == on floats
    assert a["samples"] == b["samples"] == VAL
    assert (a["processes"], b["processes"]) == (1, 2)
    assert a["checkpoint"]["step"] == 16 and a["checkpoint"]["epoch"] == 1
    # and the same as the validation the training run itself logged
    logged = [json.loads(line) for line in (trained / "runs/quickstart/metrics.jsonl").read_text().splitlines()]
    assert logged[-1]["split"] == "val" and logged[-1]["samples"] == VAL


def test_human_output_names_checkpoint_step_samples_and_metrics(trained):
    r = validate(trained, CKPT)
    assert r.returncode == 0, r.output
    assert r.stdout == ""
    for text in (CKPT, "epoch 1, step 16", f"{VAL} samples", "accuracy", "loss"):
        assert text in r.stderr


def test_overrides_change_the_dataset(trained):
    r = validate(trained, CKPT, "data.val.num_samples=101", "data.batch_size=7", "--json")
    assert r.returncode == 0, r.output
    assert json.loads(r.stdout)["samples"] == 101


def test_train_split(trained):
    r = validate(trained, CKPT, "--split", "train", "--json")
    assert r.returncode == 0 and json.loads(r.stdout)["samples"] == 512


def test_plain_state_dict_with_module_prefix_and_recipe(trained):
    model = load_ckpt(trained / CKPT)["model"]
    torch.save({f"module.{k}": v for k, v in model.items()}, trained / "plain.pt")
    r = validate(trained, "plain.pt", "--recipe", QUICK, f"data.val.num_samples={VAL}", "--json")
    assert r.returncode == 0, r.output
    ours = json.loads(validate(trained, CKPT, "--json").stdout)
    assert json.loads(r.stdout)["metrics"] == ours["metrics"]


def test_python_api_model_predicts_as_at_the_end_of_training(trained):
    import mgpucli
    from mgpucli.components.models import MLP

    loaded = mgpucli.load_checkpoint(trained / CKPT)
    ref = MLP(32, 4, [64, 64])
    ref.load_state_dict(load_ckpt(trained / CKPT)["model"])
    x = torch.randn(5, 32)
    assert torch.equal(loaded.model(x), ref.eval()(x))
    assert loaded.recipe.name == "quickstart" and loaded.info["step"] == 16


def test_a_refusal_through_the_console_script_is_exit_2_and_a_clean_message(trained):
    r = validate_in_processes(trained, "nope.pt")
    assert_usage_error(r, "checkpoint nope.pt does not exist")
    assert r.stdout == ""


def test_missing_empty_random_and_truncated_files(trained):
    assert_usage_error(validate(trained, "nope.pt"), "checkpoint nope.pt does not exist")
    (trained / "empty.pt").write_bytes(b"")
    assert_usage_error(validate(trained, "empty.pt"), "empty (0 bytes)")
    (trained / "random.pt").write_bytes(b"\x80\x04" + random.Random(7).randbytes(4096))  # pickle header + garbage
    assert_usage_error(validate(trained, "random.pt"), "not a readable checkpoint")
    data = (trained / CKPT).read_bytes()
    (trained / "cut.pt").write_bytes(data[: len(data) // 2])
    assert_usage_error(validate(trained, "cut.pt"), "not a readable checkpoint")


def test_a_valid_pickle_that_is_not_a_checkpoint(trained):
    torch.save({"hello": "world", "n": 3}, trained / "other.pt")
    assert_usage_error(validate(trained, "other.pt"), "neither an mgpu checkpoint nor a model state_dict")


class _Evil:
    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def test_malicious_pickle_is_refused_and_its_payload_never_runs(trained):
    marker = trained / "pwned"
    torch.save({"model": _Evil(marker)}, trained / "evil.pt")
    assert_usage_error(validate(trained, "evil.pt", "--recipe", QUICK),
                       "refused to load evil.pt: the checkpoint would call os.system", "Nothing from it was executed")
    assert not marker.exists()
    with open(trained / "evil.pkl", "wb") as fh:  # a bare pickle, not even a torch zip file
        pickle.dump(_Evil(marker), fh)
    assert validate(trained, "evil.pkl", "--recipe", QUICK).returncode == 2
    assert not marker.exists()


def test_weights_that_do_not_fit_the_model(trained):
    assert_usage_error(validate(trained, CKPT, "model.hidden=[16]"), "don't fit the recipe's model",
                       "shape mismatch", "unexpected in the checkpoint")


@pytest.mark.parametrize("args, fragment", [
    ((CKPT, "--weights", "ema"), "holds no EMA weights: its run was trained without trainer.ema"),
    ((CKPT, "--weights", "average"), "--weights 'average': choose model"),
])
def test_ema_weights_of_a_run_without_them(trained, args, fragment):
    assert_usage_error(validate(trained, *args), fragment)


def test_recipe_without_a_validation_dataset(trained):
    assert_usage_error(validate(trained, CKPT, "data.val=null"), "has no data.val dataset", "--split")


def _with_recipe(trained, name, mutate):
    ckpt = load_ckpt(trained / CKPT)
    ckpt["recipe"] = mutate(ckpt["recipe"])
    torch.save(ckpt, trained / name)
    return name


@pytest.mark.parametrize("target", [
    "os.system",
    "torch.nn.parallel.distributed.os.system",  # a torch path that resolves to os.system
    "builtins.eval",
])
def test_untrusted_targets_in_a_checkpoint_recipe_are_refused(trained, target):
    marker = trained / "ran"
    name = _with_recipe(trained, "bad-recipe.pt", lambda text: text.replace(
        "_target_: mgpucli.components.datasets.SyntheticClassification\n    num_samples: 333",
        f"_target_: {target}\n    _args_: ['touch {marker}']\n    num_samples: 333", 1))
    r = validate(trained, name)
    assert_usage_error(r, "calls code outside mgpu's allowlist", target, "--trust-recipe")
    assert not marker.exists()
    if target.startswith("torch."):
        assert "resolves to posix.system" in r.stderr or "resolves to os.system" in r.stderr


def test_own_recipe_or_trust_flag_bypasses_the_allowlist(trained):
    (trained / "mymodels.py").write_text("from mgpucli.components.models import MLP\n\n\nclass Net(MLP):\n    pass\n")
    name = _with_recipe(trained, "foreign.pt", lambda text: text.replace(
        "_target_: mgpucli.components.models.MLP", "_target_: mymodels.Net"))
    assert_usage_error(validate(trained, name), "model: mymodels.Net", "--trust-recipe")
    trusted = validate(trained, name, "--trust-recipe", "--json")
    assert trusted.returncode == 0, trusted.output
    own = validate(trained, name, "--recipe", QUICK, f"data.val.num_samples={VAL}", "--json")
    assert own.returncode == 0, own.output
    assert json.loads(trusted.stdout)["metrics"] == json.loads(own.stdout)["metrics"]


def test_a_ddp_runs_validation_uses_the_checkpoints_batchnorm_statistics(tmp_path):
    """Each DDP rank's forward moves its own BatchNorm statistics on after DDP's broadcast of rank 0's: validating
    on every rank with rank 0's (those the checkpoint holds) makes the run's validation the checkpoint's."""
    from tests.procs import torchrun

    layer = "{_target_: torch.nn.%s, %s}"
    model = ("+model={_target_: torch.nn.Sequential, _args_: [" + ", ".join(
        [layer % ("Linear", "in_features: 32, out_features: 64"), layer % ("BatchNorm1d", "num_features: 64"),
         "{_target_: torch.nn.ReLU}", layer % ("Linear", "in_features: 64, out_features: 4")]) + "]}")
    r = torchrun(2, "train", QUICK, "~model", model, "data.train.num_samples=512", f"data.val.num_samples={VAL}",
                 "trainer.epochs=1", "trainer.cpu_threads=1", cwd=tmp_path)
    assert r.returncode == 0, r.output
    logged = [json.loads(line) for line in (tmp_path / "runs/quickstart/metrics.jsonl").read_text().splitlines()]
    run_val = [m for m in logged if m["split"] == "val"][-1]
    again = json.loads(validate(tmp_path, CKPT, "trainer.cpu_threads=1", "--json").stdout)["metrics"]
    assert (again["loss"], again["accuracy"]) == (run_val["loss"], run_val["accuracy"])
