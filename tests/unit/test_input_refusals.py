"""Every class of bad input a user can give mgpu that needs no process to refuse, one test each, run in the test
process (tests/inproc.py): exit 2, a message naming the problem and the fix, no traceback, and nothing written.

The surfaces: the recipe's keys and the override forms, the environment variables mgpu reads, each command's options,
``mgpu recipes copy``'s destinations, components of the wrong kind. What needs a finished run (checkpoint files, run
dirs given to ``mgpu doctor``) and what must be refused before torch is imported (launch options) is in
tests/e2e/test_input_audit.py. The cheapest path that applies the same check is used: ``--check``, ``--dry-run``, or
a refusal that comes before anything starts.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import pytest

from tests.inproc import COMPOSE_CHILD, cli
from tests.procs import assert_usage_error

SMALL = ["data.train.num_samples=256", "data.val.num_samples=64"]


def snapshot(root: Path) -> dict[str, str]:
    """Every file and directory under ``root``: a digest of each file's bytes, a link's target."""
    out = {}
    for path in sorted(root.rglob("*")):
        name = str(path.relative_to(root))
        if path.is_symlink():
            out[name] = "-> " + os.readlink(path)
        else:
            out[name] = hashlib.sha1(path.read_bytes()).hexdigest() if path.is_file() else "dir"
    return out


def refused(r, cwd: Path, before: dict[str, str], *fragments: str) -> None:
    """Exit 2, no traceback, the fragments on stderr, and the directory exactly as it was."""
    assert_usage_error(r, *fragments)
    assert snapshot(cwd) == before


# ------------------------------------------------------------------------------------ the machine check
def test_a_machine_check_timeout_that_never_comes_is_refused(tmp_path):
    for value in ("inf", "nan"):
        r = cli("doctor", "--cpu", "--timeout", value, cwd=tmp_path)
        refused(r, tmp_path, {}, f"--timeout {value}: must be a finite number of seconds above 0")


# ------------------------------------------------------------------------------------ override forms and keys
@pytest.mark.parametrize("overrides, fragments", [
    pytest.param(["~trainer.epoch"], ["~trainer.epoch: the recipe has no key trainer.epoch to remove (did you mean "
                                      "'trainer.epochs'?); fix the key, or drop the override"], id="remove-missing"),
    pytest.param(["+trainer.epochs=3"], ["An item is already at 'trainer.epochs'", "'++trainer.epochs=3'"],
                 id="add-existing"),
    pytest.param(["vars.width=3"], ["To append to your config use +vars.width=3"], id="set-new-free-form-key"),
    pytest.param(["=1", "key==x"], ["override '=1' names no key", "override 'key==x' is malformed", "~key to remove"],
                 id="malformed"),
    pytest.param(["trainer=5"], ["trainer: expected a section (mapping), got 5"], id="scalar-for-section"),
    pytest.param(["trainer.epochs=[1,2]", "data.batch_size={a: 1}", "trainer.max_steps=${nope}",
                  "seed=${oc.env:MGPU_AUDIT_UNSET}", "trainer.log_every=${trainer.log_every}"],
                 ["trainer.epochs: Value '[1, 2]' of type 'list' could not be converted to Integer",
                  "data.batch_size: Value '{'a': 1}' of type 'dict' could not be converted to Integer",
                  "trainer.max_steps: Interpolation key 'nope' not found",
                  "seed: KeyError raised while resolving interpolation: \"Environment variable 'MGPU_AUDIT_UNSET' not "
                  "found\"", "trainer.log_every: Recursive interpolation detected"], id="values-and-interpolations"),
    pytest.param(["name=", "run_dir=  "], ["name: empty; it names the run dir",
                                           "run_dir: empty; the run would write its checkpoints and records into the "
                                           "working directory"], id="empty-name-and-run-dir"),
])
def test_an_override_that_cannot_apply_is_a_recipe_problem(tmp_path, overrides, fragments):
    """Every override form (key=value, +key, ~key, lists, mappings, interpolations): one message listing what is
    wrong with each, before anything is built or written."""
    r = cli("train", "quickstart", *overrides, "--check", cwd=tmp_path)
    refused(r, tmp_path, {}, "problem(s) in recipe quickstart", *fragments)


# ---------------------------------------------------------------------------------- environment variables
CHECK = ["train", "quickstart", "--check"]
TRAIN = ["train", "quickstart", *SMALL]
DRY_RUN = ["launch", "--cpu", "quickstart", "--dry-run"]


@pytest.mark.parametrize("env, command, fragments", [
    pytest.param({"RANK": "one", "WORLD_SIZE": "2"}, CHECK, ["RANK='one' in the environment is not an integer"],
                 id="rank-not-an-integer"),
    pytest.param({"RANK": "1"}, CHECK, ["RANK and WORLD_SIZE must be set together; WORLD_SIZE is missing"],
                 id="rank-without-world-size"),
    pytest.param({"RANK": "2", "WORLD_SIZE": "2"}, CHECK, ["RANK=2 does not fit WORLD_SIZE=2"], id="stale-rank"),
    pytest.param({"LOCAL_RANK": "-1"}, CHECK, ["LOCAL_RANK=-1 is negative"], id="negative-local-rank"),
    pytest.param({"RANK": "0", "WORLD_SIZE": "2", "MASTER_ADDR": "", "MASTER_PORT": ""}, TRAIN,
                 ["RANK=0 and WORLD_SIZE=2 make this process one rank of a job, but MASTER_ADDR and MASTER_PORT are "
                  "not set", "unset RANK WORLD_SIZE LOCAL_RANK"], id="rank-without-rendezvous"),
    pytest.param({"RANK": "0", "WORLD_SIZE": "2", "MASTER_ADDR": "localhost", "MASTER_PORT": "http"}, TRAIN,
                 ["MASTER_PORT='http' is not a port number"], id="master-port-not-a-number"),
    pytest.param({"CUDA_VISIBLE_DEVICES": "0,gpu1"}, ["launch", "quickstart", "--dry-run"],
                 ["CUDA_VISIBLE_DEVICES='0,gpu1': entry 'gpu1' is not a GPU index or UUID",
                  "Fix or unset CUDA_VISIBLE_DEVICES"], id="cuda-visible-devices"),
    pytest.param({"SLURM_JOB_ID": "12", "SLURM_NNODES": "two"}, DRY_RUN,
                 ["SLURM node count 'two' is not an integer", "--nnodes N"], id="slurm-node-count"),
    pytest.param({"SLURM_JOB_ID": "12", "SLURM_NNODES": "2", "SLURM_NODEID": "0", "SLURM_JOB_NODELIST": "n[1-2"},
                 DRY_RUN, ["Cannot read the SLURM node list 'n[1-2': unbalanced '['", "--master-addr HOST"],
                 id="slurm-node-list"),
    pytest.param({"MGPU_FAULT": "crash@step=three"}, TRAIN, ["MGPU_FAULT='crash@step=three': 'step=three' is "
                 "neither rank=N nor step=N", "unset MGPU_FAULT"], id="mgpu-fault"),
    pytest.param({"MGPU_FAULT": "explode"}, TRAIN, ["'explode' is no fault (known: crash, nan"],
                 id="mgpu-fault-unknown"),
])
def test_an_environment_variable_mgpu_cannot_use_is_named(tmp_path, env, command, fragments):
    """The rank variables a stale shell keeps, a malformed GPU list, SLURM's variables, a test-only fault spec:
    exit 2 before a run dir exists (``mgpu train`` itself where the check is the run's own, else --check or
    --dry-run). OMP_NUM_THREADS: test_train_errors.py."""
    refused(cli(*command, cwd=tmp_path, env=env, allowed=(COMPOSE_CHILD,)), tmp_path, {}, *fragments)


# ---------------------------------------------------------------------------------- command-line options
@pytest.mark.parametrize("args, fragment", [
    (["train", "quickstart", "--epochs", "3"], "No such option: --epochs"),
    (["launch", "--cpu", "--nproc", "two", "quickstart"], "Invalid value for '--nproc': 'two' is not a valid integer"),
    (["validate"], "Missing argument 'CHECKPOINT'"),
    (["doctor", "--timeout", "soon"], "Invalid value for '--timeout': 'soon' is not a valid float"),
    (["recipes", "show", "quickstart", "digits"], "Got unexpected extra argument(s) (digits)"),
    (["--local-rank", "first", "train", "quickstart"], "'first' is not a valid integer"),
])
def test_an_option_the_command_line_parser_refuses_is_exit_2_without_a_traceback(tmp_path, args, fragment):
    r = cli(*args, cwd=tmp_path, env={"COLUMNS": "200"})
    refused(r, tmp_path, {}, fragment)


@pytest.mark.parametrize("args, fragments", [
    (["notes.txt/quickstart.yaml"], ["cannot write notes.txt/quickstart.yaml: notes.txt is a file, not a directory"]),
    (["nowhere/quickstart.yaml"], ["the directory nowhere does not exist", "a directory that exists"]),
    (["notes.txt"], ["notes.txt already exists; not overwriting it", "--force"]),
    (["mine.yaml", "--name", "my run"], ["--name 'my run': a recipe name becomes its run dir"]),
])
def test_recipes_copy_never_writes_where_it_should_not(tmp_path, args, fragments):
    (tmp_path / "notes.txt").write_text("mine\n")
    before = snapshot(tmp_path)
    refused(cli("recipes", "copy", "quickstart", *args, cwd=tmp_path), tmp_path, before, *fragments)


# ------------------------------------------------------------------------------------ components of the wrong kind
@pytest.mark.parametrize("command", [["train", *SMALL], ["launch", "--cpu", "--dry-run"]])
@pytest.mark.parametrize("override, fragment", [
    ("model._partial_=true", "model: _partial_ is true, so mgpucli.components.models.MLP gave a function still to "
                             "call, where mgpu needs a torch.nn.Module"),
    ("model._target_=builtins.dict", "model: builtins.dict gave a dict, where mgpu needs a torch.nn.Module"),
    ("optim._partial_=true", "optim: _partial_ is true, so torch.optim.SGD gave a function still to call, where "
                             "mgpu needs a torch.optim.Optimizer"),
])
def test_a_component_that_builds_into_the_wrong_kind_of_object_is_a_recipe_problem(tmp_path, command, override,
                                                                                   fragment):
    """A _target_ that builds, but not a model (or an optimizer) mgpu can train: the AttributeError of the first
    use ('dict' object has no attribute 'to') becomes the key, what it gave and what it must give."""
    r = cli(command[0], "quickstart", *command[1:], override, cwd=tmp_path, allowed=(COMPOSE_CHILD,))
    refused(r, tmp_path, {}, fragment)


# ------------------------------------------------------------------------------------ launch flags and run dirs
def test_resume_target_missing_and_contradictory_flags_are_refused_at_the_launcher(tmp_path):
    """The launcher refuses these itself: no worker, no run dir."""
    r = cli("launch", "--cpu", "--nproc", "2", "quickstart", "--resume", "nope/last.pt", cwd=tmp_path,
            allowed=(COMPOSE_CHILD,))
    assert_usage_error(r, "--resume nope/last.pt: no such checkpoint", "--resume auto")
    r = cli("launch", "--cpu", "--nproc", "2", "quickstart", "--resume", "auto", "--overwrite", cwd=tmp_path,
            allowed=(COMPOSE_CHILD,))
    assert_usage_error(r, "contradict", "--overwrite")
    (tmp_path / "blocker").write_text("a file where the run dir should go")
    r = cli("launch", "--cpu", "--nproc", "2", "quickstart", "run_dir=blocker/run", "--dry-run", cwd=tmp_path,
            allowed=(COMPOSE_CHILD,))
    assert_usage_error(r, "cannot create run dir", "is a file, not a directory", "run_dir=")
    assert not (tmp_path / "runs").exists()
