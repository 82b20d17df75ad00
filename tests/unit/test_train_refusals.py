"""Every bad input to `mgpu train` (and its checks under `mgpu launch --check`) that needs no process to refuse, run in
the test process (tests/inproc.py): exit 2, one message naming the problem and the fix, no traceback.

What needs real processes is in tests/e2e/test_train_errors.py: refused before torch is imported, bad input under
torchrun, and one plain `mgpu launch` per class of component problem (local rank 0's worker finds those).
"""

from __future__ import annotations

import pytest
import torch

from tests.inproc import COMPOSE_CHILD, cli
from tests.procs import RECIPES, assert_usage_error

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
    assert_usage_error(cli("train", QUICK, *SMALL, *overrides, cwd=tmp_path), *fragments)
    assert not (tmp_path / "runs" / "quickstart" / "checkpoints").exists() or "strategy" in overrides[0] \
        or "num_samples" in overrides[0]


# The ways into the recipe's check that need no process: train, its --check, the launcher's --check. A plain launch
# leaves the components to local rank 0's worker: one real launch per class of problem in tests/e2e.
COMMANDS = [["train"], ["train", "--check"], ["launch", "--cpu", "--nproc", "2", "--check"]]
# A recipe that does not compose is refused by the launcher itself, on a plain launch too.
COMPOSE_COMMANDS = [*COMMANDS, ["launch", "--cpu", "--nproc", "2"]]


def on_every_command(*cases, commands=COMMANDS) -> list:
    """Each case on one of ``commands``, in turn, until every case and every command has had a test: each way into
    the check meets the class of bad input, and each bad value is seen once."""
    cases = [case if isinstance(case, tuple) else (case,) for case in cases]
    params = []
    for i in range(max(len(cases), len(commands))):
        command = commands[i % len(commands)]
        shown = " ".join(word for word in command if word not in ("--cpu", "--nproc", "2"))
        params.append(pytest.param(command, *cases[i % len(cases)], id=f"{shown}-case{i % len(cases)}"))
    return params


def mgpu_here(*args: str, cwd, env=None):
    """``mgpu ARGS`` in the test process; a launch may compose its recipe in its compose child."""
    return cli(*args, cwd=cwd, env=env, allowed=(COMPOSE_CHILD,))


@pytest.mark.parametrize("command, override", on_every_command("optim.lrr=0.1", "+optim.lrr=0.1"))
def test_a_component_typo_gets_the_signatures_did_you_mean_and_never_a_plus(tmp_path, command, override):
    r = mgpu_here(*command, "quickstart", override, cwd=tmp_path)
    assert_usage_error(r, "optim.lrr: torch.optim.SGD takes no argument 'lrr' (did you mean 'lr'?)")
    assert "+optim.lrr" not in r.output and r.output.count("problem(s) in recipe") == 1
    assert list(tmp_path.iterdir()) == []  # no run dir, no logs: nothing started


def test_a_component_argument_the_recipe_leaves_out_is_set_with_key_value(tmp_path):
    r = mgpu_here("train", "quickstart", "optim.weight_decay=0.01", "--check", cwd=tmp_path)
    assert r.returncode == 0 and "weight_decay: 0.01" in r.stdout, r.output


def test_yaml_syntax_error_names_the_line(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: x\ntrainer:\n  epochs: [1\n")
    assert_usage_error(mgpu_here("train", str(bad), cwd=tmp_path), "YAML syntax error at line")


def test_resume_path_missing(tmp_path):
    assert_usage_error(mgpu_here("train", QUICK, *SMALL, "--resume", "gone.pt", cwd=tmp_path),
                       "--resume gone.pt: no such checkpoint", "--resume auto")


def test_resume_from_something_that_is_not_an_mgpu_checkpoint(tmp_path):
    torch.save({"weight": torch.zeros(2)}, tmp_path / "plain.pt")
    assert_usage_error(mgpu_here("train", QUICK, *SMALL, "--resume", "plain.pt", cwd=tmp_path),
                       "plain.pt is not an mgpu checkpoint")


def test_resume_into_a_model_that_does_not_fit(tmp_path):
    assert mgpu_here("train", QUICK, *SMALL, "trainer.max_steps=2", cwd=tmp_path).returncode == 0
    r = mgpu_here("train", QUICK, *SMALL, "model.hidden=[32]", "--resume", "auto", cwd=tmp_path)
    assert_usage_error(r, "don't fit the recipe's model", "shape mismatch", "net.0.weight (checkpoint (64, 32), "
                       "model (32, 32))", "unexpected in the checkpoint (2): net.4.weight, net.4.bias")


def test_async_save_of_a_run_that_keeps_its_full_checkpoints_is_refused(tmp_path):
    """trainer.checkpoint_format=auto: FSDP resuming a full checkpoint keeps writing full ones, which trainer.async_save
    cannot write; refused before anything is built or written."""
    assert mgpu_here("train", QUICK, *SMALL, "trainer.max_steps=2", cwd=tmp_path).returncode == 0  # last.pt
    r = mgpu_here("train", QUICK, *SMALL, "trainer.strategy=fsdp", "trainer.async_save=true", "--resume", "auto",
                  cwd=tmp_path)
    assert_usage_error(r, "trainer.async_save writes sharded checkpoints, but this run continues",
                       "last.pt, a full checkpoint, and keeps its format", "trainer.checkpoint_format=sharded")


def test_run_dir_that_cannot_be_created(tmp_path):
    (tmp_path / "afile").write_text("x")
    assert_usage_error(mgpu_here("train", QUICK, *SMALL, "run_dir=afile/run", cwd=tmp_path),
                       "cannot create run dir afile/run: afile is a file", "run_dir=PATH")


@pytest.mark.parametrize("command, override, fragments", on_every_command(
    ("optim.lr=abc", ["optim: building torch.optim.SGD failed: optim.lr='abc' is a string; SGD needs a number"]),
    ("optim.momentum=-1", ["optim: building torch.optim.SGD failed: ValueError: Invalid momentum value: -1"]),
    ("model.dropout=2", ["model: building mgpucli.components.models.MLP failed: ValueError: dropout probability"]),
))
def test_a_component_whose_constructor_raises_is_a_recipe_problem(tmp_path, command, override, fragments):
    """Whatever a component's constructor raises: exit 2 with the key, the target and the exception, and nothing
    written (a plain launch, whose worker finds it: tests/e2e/test_train_errors.py)."""
    r = mgpu_here(*command, "quickstart", override, cwd=tmp_path)
    assert_usage_error(r, *fragments, "quickstart", "MGPU_DEBUG=1")
    assert not (tmp_path / "runs").exists() or command == ["train"]  # train takes its run dir before it builds
    assert not list(tmp_path.glob("runs/quickstart/logs/*/attempt_0"))  # no worker started


def test_mgpu_debug_shows_the_components_traceback(tmp_path):
    r = mgpu_here("train", "quickstart", "optim.momentum=-1", "--check", cwd=tmp_path, env={"MGPU_DEBUG": "1"})
    assert r.returncode == 2 and "Traceback" in r.stderr and 'raise ValueError(f"Invalid momentum value' in r.stderr


@pytest.mark.parametrize("command, name, content, fragment", on_every_command(
    ("binary.yaml", bytes(range(256)), "is not UTF-8 text (byte 0x80 at position 128)"),
    ("empty.yaml", b"# nothing but a comment\n", "is empty"),
    ("list.yaml", b"- name: a\n- name: b\n", "holds a list at the top, not a mapping of keys"),
    ("scalar.yaml", b"42\n", "holds a single value (int) at the top"),
    commands=COMPOSE_COMMANDS))
def test_a_file_that_is_no_recipe_is_named_with_its_problem(tmp_path, command, name, content, fragment):
    (tmp_path / name).write_bytes(content)
    r = mgpu_here(*command, name, cwd=tmp_path)
    assert_usage_error(r, f"{name} {fragment}" if "UTF-8" not in fragment else fragment, name)
    assert not (tmp_path / "runs").exists()


def test_a_directory_is_no_recipe(tmp_path):
    (tmp_path / "conf.yaml").mkdir()
    assert_usage_error(mgpu_here("train", "conf.yaml", cwd=tmp_path), "conf.yaml is not a file")


@pytest.mark.parametrize("command, override, fragments", on_every_command(
    ("trainer.clip_grad_norm=-1", ["trainer.clip_grad_norm: must be > 0", "got -1.0"]),
    ("trainer.best_metric=acc", ["trainer.best_metric: 'acc' is not a metric the task reports (loss, accuracy) "
                                 "(did you mean 'accuracy'?)"]),
    ("trainer.strategy=fsdp trainer.fsdp.wrap=[Nope]", ["trainer.fsdp.wrap names 'Nope', which the model doesn't "
                                                        "contain (its module classes: Linear, MLP, ReLU, Sequential)"]),
    ("trainer.activation_checkpointing=[Linearr]", ["trainer.activation_checkpointing names 'Linearr' (did you mean "
                                                    "'Linear'?)"]),
    ("trainer.activation_checkpointing=true", ["activation checkpointing found no blocks to checkpoint",
                                               "e.g. trainer.activation_checkpointing=[Bottleneck]"]),
))
def test_values_that_type_check_but_make_no_sense_are_refused(tmp_path, command, override, fragments):
    r = mgpu_here(*command, "quickstart", *override.split(), cwd=tmp_path)
    assert_usage_error(r, *fragments)
    assert not list(tmp_path.glob("runs/quickstart/checkpoints/*.pt"))
    if command[0] == "launch":  # the launcher's own check: no worker started, nothing written
        assert not (tmp_path / "runs").exists() and "[rank" not in r.output


@pytest.mark.parametrize("command", [["train", "quickstart"], ["launch", "--cpu", "--nproc", "2", "quickstart"]])
def test_an_omp_num_threads_torch_would_ignore_is_refused(tmp_path, command):
    r = mgpu_here(*command, cwd=tmp_path, env={"OMP_NUM_THREADS": "four"})
    assert_usage_error(r, "OMP_NUM_THREADS='four' is not a positive integer", "unset OMP_NUM_THREADS")
    assert not (tmp_path / "runs").exists()


@pytest.mark.parametrize("command, batch, processes", [(["train", "--check"], 48, 1),
                                                       (["launch", "--cpu", "--nproc", "2", "--check"], 24, 2)])
def test_check_refuses_a_train_set_without_a_batch_for_every_process(tmp_path, command, batch, processes):
    """What the workers would refuse once they had built the dataset, --check says first."""
    r = mgpu_here(*command, "quickstart", "data.train.num_samples=40", f"data.batch_size={batch}", cwd=tmp_path)
    assert_usage_error(r, f"data.train has 40 samples: too few for one batch of {batch} on each of {processes} "
                       f"process(es) (needs {batch * processes})", "a smaller data.batch_size, or fewer processes")
    assert not (tmp_path / "runs").exists()
    fits = mgpu_here(*command, "quickstart", "data.train.num_samples=40", f"data.batch_size={40 // processes}",
                     cwd=tmp_path)
    assert fits.returncode == 0, fits.output
