"""Every class of bad input a user can give mgpu, one test each: exit 2, a message naming the problem and the fix,
no traceback, and nothing written or lost (issue 24's audit).

The surfaces: each command's arguments and options, the recipe's keys and the override forms, the environment
variables mgpu reads, checkpoint files (``--resume``, ``mgpu validate``) and run dirs given to ``mgpu doctor``.
Other files cover classes of their own: recipe values and component errors (test_train_errors.py), checkpoint
files given to ``mgpu validate`` (test_validate.py), the machine check's options (test_doctor.py), unknown recipe
names (test_recipes.py), run dirs holding checkpoints (test_first_hour.py), a full disk (test_disk_full.py).
The cheapest path that applies the same check is used: ``--check``, ``--dry-run``, or a refusal that comes before
anything starts.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from pathlib import Path

import pytest
import torch

from tests.procs import assert_usage_error, mgpu

SMALL = ["data.train.num_samples=256", "data.val.num_samples=64"]
LAUNCH = ["launch", "--cpu", "--nproc", "2", "quickstart", *SMALL]
LAST = "runs/quickstart/checkpoints/last.pt"


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


@pytest.fixture(scope="module")
def trained(tmp_path_factory) -> Path:
    """A finished 2-process launch of the quickstart (its run dir, checkpoints and launch record), read-only."""
    cwd = tmp_path_factory.mktemp("audit")
    r = mgpu(*LAUNCH, "trainer.max_steps=4", cwd=cwd, timeout=120)
    assert r.returncode == 0, r.output
    return cwd


@pytest.fixture
def run(trained, tmp_path) -> Path:
    """A copy of the trained run's working directory, for a test that gives it bad input (its launch record names
    the copy's files, as if it had run there)."""
    shutil.copytree(trained / "runs", tmp_path / "runs", symlinks=True)
    record = tmp_path / "runs/quickstart/launch.json"
    record.write_text(record.read_text().replace(str(trained), str(tmp_path)))
    return tmp_path


def refused(r, cwd: Path, before: dict[str, str], *fragments: str) -> None:
    """Exit 2, no traceback, the fragments on stderr, and the directory exactly as it was."""
    assert_usage_error(r, *fragments)
    assert snapshot(cwd) == before


# ----------------------------------------------------------------------------------------- checkpoint files
def _bad_checkpoints(cwd: Path) -> None:
    """Every class of file a user may pass to --resume, written next to the run."""
    good = torch.load(cwd / LAST, weights_only=True)
    data = (cwd / LAST).read_bytes()
    (cwd / "empty.pt").write_bytes(b"")
    (cwd / "cut.pt").write_bytes(data[: len(data) // 2])
    (cwd / "notes.pt").write_text("not a checkpoint\n")
    (cwd / "adir.pt").mkdir()
    torch.save(good["model"], cwd / "plain.pt")
    torch.save({k: v for k, v in good.items() if k != "optimizer"}, cwd / "edited.pt")
    torch.save({**good, "mgpu_format": 99}, cwd / "newer.pt")
    (cwd / "link.pt").symlink_to("deleted.pt")
    torch.save({"model": _Evil(cwd / "pwned")}, cwd / "evil.pt")


class _Evil:
    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


@pytest.mark.parametrize("name, fragments", [
    ("empty.pt", ["empty.pt is empty (0 bytes)"]),
    ("cut.pt", ["cut.pt is not a checkpoint file that torch.save wrote (truncated"]),
    ("notes.pt", ["notes.pt is not a checkpoint file that torch.save wrote"]),
    ("adir.pt", ["adir.pt is a directory without meta.pt: not a sharded mgpu checkpoint"]),
    ("plain.pt", ["plain.pt is not an mgpu checkpoint", "a plain state_dict"]),
    ("edited.pt", ["edited.pt has no optimizer: not a complete mgpu checkpoint"]),
    ("newer.pt", ["newer.pt was written by a newer mgpu (checkpoint format 99; this mgpu reads format 1)"]),
    ("link.pt", ["--resume link.pt: no such checkpoint (a link to deleted.pt, which is gone)"]),
    ("evil.pt", ["evil.pt is not an mgpu checkpoint"]),
])
def test_a_resume_checkpoint_that_is_no_mgpu_checkpoint_is_refused_before_any_worker(run, name, fragments):
    _bad_checkpoints(run)
    before = snapshot(run)
    r = mgpu(*LAUNCH, "--resume", name, cwd=run, timeout=90)
    refused(r, run, before, *fragments, "start afresh without --resume" if "link" not in name else "--resume auto")
    assert not (run / "pwned").exists()


def test_a_checkpoint_that_does_not_fit_the_model_leaves_the_run_dir_as_it_was(run):
    """The fit is known only once the model exists: the worker reads the checkpoint before it takes the run dir
    (the earlier run's recipe.yaml, metrics and TensorBoard events stay as they were)."""
    before = snapshot(run)
    r = mgpu("train", "quickstart", *SMALL, "model.hidden=[16]", "--resume", "auto", cwd=run, timeout=90)
    refused(r, run, before, "don't fit the recipe's model", "shape mismatch", "Use the recipe the checkpoint "
            "was trained with")


@pytest.mark.parametrize("target, fragments", [
    ("step-00000010.dcp", ["--resume auto continues from runs/quickstart/checkpoints/last.dcp (a link to "
                           "step-00000010.dcp, which is gone)", "--resume PATH", "--overwrite"]),
    (None, ["--resume auto continues from runs/quickstart/checkpoints/last.dcp, which does not exist",
            "holds best.pt, last.pt (trainer.checkpoint_format=sharded)"]),
])
def test_resume_auto_without_the_checkpoint_it_continues_from_says_what_is_there(run, target, fragments):
    if target:
        (run / "runs/quickstart/checkpoints/last.dcp").symlink_to(target)
    before = snapshot(run)
    r = mgpu("train", "quickstart", *SMALL, "trainer.strategy=fsdp", "trainer.checkpoint_format=sharded",
             "--resume", "auto", "--check", cwd=run, timeout=90)
    refused(r, run, before, *fragments)


@pytest.mark.parametrize("args, fragments", [
    (["newer.pt"], ["newer.pt was written by a newer mgpu (checkpoint format 99; this mgpu reads format 1)",
                    "Upgrade mgpu"]),
    (["adir.pt"], ["adir.pt is a directory, not a checkpoint file"]),
    ([LAST, "trainer.epchs=2"], [f"1 problem(s) in recipe stored in {LAST}:", "did you mean 'trainer.epochs'?",
                                 "--recipe RECIPE"]),
    ([LAST, "--cpu", "--nproc", "0"], ["--nproc 0: the process count must be at least 1"]),
    ([LAST, "--nproc", "1"], ["--nproc sets the number of CPU processes and needs --cpu"]),
])
def test_validate_refuses_a_checkpoint_or_option_it_cannot_use(run, args, fragments):
    _bad_checkpoints(run)
    before = snapshot(run)
    refused(mgpu("validate", *args, cwd=run, timeout=90), run, before, *fragments)


# ------------------------------------------------------------------------------------------ empty arguments
@pytest.mark.parametrize("args, fragment", [
    (["train", ""], "the recipe is '': empty."),
    (["launch", "--cpu", " "], "the recipe is ' ': empty."),
    (["validate", ""], "the checkpoint is '': empty."),
    (["validate", LAST, "--recipe", ""], "the recipe is '': empty."),
    (["doctor", ""], "RUN_DIR is '': empty."),
    (["train", "quickstart", "--resume", "", "--check"], "--resume is empty: it takes a checkpoint's path or 'auto'"),
])
def test_an_empty_argument_is_refused_not_read_as_the_current_directory(run, args, fragment):
    """``mgpu train "$RECIPE"`` with the variable unset: the empty path must not mean ``.``."""
    before = snapshot(run)
    refused(mgpu(*args, cwd=run, timeout=90), run, before, fragment)


# ------------------------------------------------------------------------------------ run dirs given to doctor
def _edit_launch_json(run_dir: Path, edit) -> None:
    path = run_dir / "launch.json"
    data = json.loads(path.read_text())
    edit(data)
    path.write_text(json.dumps(data))


@pytest.mark.parametrize("edit, fragment", [
    (lambda d: d.clear(), "it holds none of the fields mgpu launch writes (mgpu_version, argv, attempts)"),
    (lambda d: d.update(attempts="all of them"), "its field attempts is a string, where mgpu launch writes a list"),
    (lambda d: d["attempts"][0]["ranks"]["0"].update(rank="zero"),
     "its field attempts[0].ranks.0.rank is a string, where mgpu launch writes a number"),
    (lambda d: d["result"].update(exitcodes={"first": 1}),
     "its field result.exitcodes has the key 'first', where mgpu launch writes rank numbers"),
    (lambda d: (d.pop("attempts"), d.pop("result")), "(written by mgpu 0.1.0): it has no attempts and no result"),
])
def test_a_launch_record_mgpu_launch_did_not_write_is_named_not_diagnosed(run, edit, fragment):
    """A launch.json edited by hand or written by another program or version: exit 2 naming the field, where the
    post-mortem crashed (AttributeError) or diagnosed a run that never was."""
    _edit_launch_json(run / "runs/quickstart", edit)
    before = snapshot(run)
    r = mgpu("doctor", "runs/quickstart", "--json", cwd=run, timeout=60)
    refused(r, run, before, "launch.json is no launch record mgpu doctor can read", fragment)
    assert r.stdout == ""


@pytest.mark.parametrize("setup, fragment", [
    (lambda d: (d / "launch.json").write_text('{"mgpu_version": "0.1.0", "attempts": ['), "cannot be read as JSON"),
    (lambda d: (d / "launch.json").write_text("[1, 2]\n"), "cannot be read as JSON"),
    (lambda d: (d / "launch.json").unlink(), "holds no launch.json"),
    (lambda d: None, "is a file, not a run directory"),
])
def test_a_path_that_is_no_run_dir_is_refused(run, setup, fragment):
    run_dir = run / "runs/quickstart"
    setup(run_dir)
    target = "runs/quickstart/metrics.jsonl" if "a file" in fragment else "runs/quickstart"
    before = snapshot(run)
    refused(mgpu("doctor", target, cwd=run, timeout=60), run, before, fragment, "`mgpu launch`")


def test_a_run_whose_logs_were_deleted_is_still_read_and_says_so(run):
    """Not bad input: the post-mortem reads what is left (launch.json, metrics), and names what is gone."""
    shutil.rmtree(run / "runs/quickstart/logs")
    r = mgpu("doctor", "runs/quickstart", cwd=run, timeout=60)
    assert r.returncode == 0 and "Traceback" not in r.output, r.output
    assert "finished" in r.stderr and "(gone: deleted or moved; read from launch.json alone)" in r.stderr
    _edit_launch_json(run / "runs/quickstart", lambda d: d["result"].update(status="failed", exit_code=1,
                                                                              exitcodes={"0": 1, "1": 0}))
    r = mgpu("doctor", "runs/quickstart", cwd=run, timeout=60)
    assert r.returncode == 1 and "Traceback" not in r.output, r.output
    assert "rank 0 failed, and its logs are missing" in r.stderr


def test_a_machine_check_timeout_that_never_comes_is_refused(tmp_path):
    for value in ("inf", "nan"):
        r = mgpu("doctor", "--cpu", "--timeout", value, cwd=tmp_path, timeout=60)
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
    r = mgpu("train", "quickstart", *overrides, "--check", cwd=tmp_path, timeout=60)
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
    refused(mgpu(*command, cwd=tmp_path, env=env, timeout=60), tmp_path, {}, *fragments)


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
    r = mgpu(*args, cwd=tmp_path, env={"COLUMNS": "200"}, timeout=30)
    refused(r, tmp_path, {}, fragment)


@pytest.mark.parametrize("args, fragments", [
    pytest.param(["--nproc", "0"], ["--nproc 0: the process count must be at least 1"], id="nproc-zero"),
    pytest.param(["--nnodes", "0"], ["--nnodes 0: must be at least 1"], id="nnodes-zero"),
    pytest.param(["--node-rank", "1"], ["--node-rank 1 does not fit --nnodes 1"], id="node-rank-out-of-range"),
    pytest.param(["--master-port", "70000"], ["--master-port 70000: a TCP port is a number from 1 to 65535"],
                 id="port-out-of-range"),
    pytest.param(["--max-restarts", "-1"], ["--max-restarts -1: must be 0 or more"], id="negative-restarts"),
    pytest.param(["--join-timeout", "30"], ["--join-timeout 30 is for jobs of several nodes"], id="join-one-node"),
    pytest.param(["--nnodes", "2", "--node-rank", "1", "--master-addr", "127.0.0.1", "--master-port", "29500",
                  "--join-timeout", "0"], ["--join-timeout 0: must be a number of seconds above 0"],
                 id="join-timeout-zero"),
    pytest.param(["--rdzv-endpoint", "node01"], ["--rdzv-endpoint 'node01' is not HOST:PORT"], id="endpoint-form"),
    pytest.param(["--rdzv-endpoint", "h:29400", "--master-port", "29500"], ["exclude each other"],
                 id="two-rendezvous"),
    pytest.param(["--master-addr", "node01"], ["--master-addr without --master-port"], id="addr-without-port"),
    pytest.param(["--gpus", "1"], ["--cpu and --gpus exclude each other"], id="cpu-and-gpus"),
    pytest.param(["--log-dir", "notes.txt"], ["--log-dir notes.txt:", "notes.txt is a file, not a directory"],
                 id="log-dir-a-file"),
])
def test_a_launch_option_out_of_range_or_contradicting_another_is_refused_before_anything_starts(tmp_path, args,
                                                                                                 fragments, no_torch):
    """Without --dry-run: the refusal must come before the run dir or any worker exists (--log-dir naming a file
    reached torch's agent: a NotADirectoryError traceback, exit 1, a run dir created), and before torch is imported
    (said at once, not after torch's import): here torch cannot be imported."""
    (tmp_path / "notes.txt").write_text("mine\n")
    before = snapshot(tmp_path)
    r = mgpu("launch", "--cpu", "quickstart", *args, cwd=tmp_path, env=no_torch, timeout=60)
    refused(r, tmp_path, before, *fragments)


@pytest.mark.parametrize("args, fragments", [
    (["notes.txt/quickstart.yaml"], ["cannot write notes.txt/quickstart.yaml: notes.txt is a file, not a directory"]),
    (["nowhere/quickstart.yaml"], ["the directory nowhere does not exist", "a directory that exists"]),
    (["notes.txt"], ["notes.txt already exists; not overwriting it", "--force"]),
    (["mine.yaml", "--name", "my run"], ["--name 'my run': a recipe name becomes its run dir"]),
])
def test_recipes_copy_never_writes_where_it_should_not(tmp_path, args, fragments):
    (tmp_path / "notes.txt").write_text("mine\n")
    before = snapshot(tmp_path)
    refused(mgpu("recipes", "copy", "quickstart", *args, cwd=tmp_path, timeout=30), tmp_path, before, *fragments)


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
    r = mgpu(command[0], "quickstart", *command[1:], override, cwd=tmp_path, timeout=90)
    refused(r, tmp_path, {}, fragment)
