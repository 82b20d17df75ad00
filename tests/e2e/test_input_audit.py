"""Every class of bad input a user can give mgpu that needs a finished run or a fresh process, one test each: exit 2,
a message naming the problem and the fix, no traceback, and nothing written or lost (issue 24's audit).

The surfaces here: checkpoint files (``--resume``, ``mgpu validate``) and run dirs given to ``mgpu doctor``, read
from one finished 2-process launch (the refusals themselves run in the test process, tests/inproc.py: a process
started by one fails its test), and the launcher's options, refused before torch is imported (a fresh process each,
where torch cannot be imported). What needs neither (override forms, environment variables, the parser's options,
``recipes copy``, components of the wrong kind) is in tests/unit/test_input_refusals.py.
Other files cover classes of their own: recipe values and component errors (test_train_errors.py), checkpoint
files given to ``mgpu validate`` (test_validate.py), the machine check's options (test_doctor.py), unknown recipe
names (test_recipes.py), run dirs holding checkpoints (test_first_hour.py), a full disk (test_disk_full.py).
The cheapest path that applies the same check is used: ``--check``, ``--dry-run``, or a refusal that comes before
anything starts.
"""
from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest
import torch

from tests.inproc import COMPOSE_CHILD, cli
from tests.procs import mgpu
from tests.unit.test_input_refusals import refused, snapshot

SMALL = ["data.train.num_samples=256", "data.val.num_samples=64"]
LAUNCH = ["launch", "--cpu", "--nproc", "2", "quickstart", *SMALL]
LAST = "runs/quickstart/checkpoints/last.pt"


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
    r = cli(*LAUNCH, "--resume", name, cwd=run, allowed=(COMPOSE_CHILD,))
    refused(r, run, before, *fragments, "start afresh without --resume" if "link" not in name else "--resume auto")
    assert not (run / "pwned").exists()


def test_a_checkpoint_that_does_not_fit_the_model_leaves_the_run_dir_as_it_was(run):
    """The fit is known only once the model exists: the worker reads the checkpoint before it takes the run dir
    (the earlier run's recipe.yaml, metrics and TensorBoard events stay as they were)."""
    before = snapshot(run)
    r = cli("train", "quickstart", *SMALL, "model.hidden=[16]", "--resume", "auto", cwd=run)
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
    r = cli("train", "quickstart", *SMALL, "trainer.strategy=fsdp", "trainer.checkpoint_format=sharded",
            "--resume", "auto", "--check", cwd=run)
    refused(r, run, before, *fragments)


@pytest.mark.parametrize("args, fragments", [
    (["newer.pt"], ["newer.pt was written by a newer mgpu (checkpoint format 99; this mgpu reads format 1)",
                    "Upgrade mgpu"]),
    (["adir.pt"], ["adir.pt is a directory without meta.pt: not a sharded mgpu checkpoint"]),
    ([LAST, "trainer.epchs=2"], [f"1 problem(s) in recipe stored in {LAST}:", "did you mean 'trainer.epochs'?",
                                 "--recipe RECIPE"]),
    ([LAST, "--cpu", "--nproc", "0"], ["--nproc 0: the process count must be at least 1"]),
    ([LAST, "--nproc", "1"], ["--nproc sets the number of CPU processes and needs --cpu"]),
])
def test_validate_refuses_a_checkpoint_or_option_it_cannot_use(run, args, fragments):
    _bad_checkpoints(run)
    before = snapshot(run)
    refused(cli("validate", *args, cwd=run), run, before, *fragments)


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
    refused(cli(*args, cwd=run, allowed=(COMPOSE_CHILD,)), run, before, fragment)


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
    r = cli("doctor", "runs/quickstart", "--json", cwd=run)
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
    refused(cli("doctor", target, cwd=run), run, before, fragment, "`mgpu launch`")


def test_a_run_whose_logs_were_deleted_is_still_read_and_says_so(run):
    """Not bad input: the post-mortem reads what is left (launch.json, metrics), and names what is gone."""
    shutil.rmtree(run / "runs/quickstart/logs")
    r = cli("doctor", "runs/quickstart", cwd=run)
    assert r.returncode == 0 and "Traceback" not in r.output, r.output
    assert "finished" in r.stderr and "(gone: deleted or moved; read from launch.json alone)" in r.stderr
    _edit_launch_json(run / "runs/quickstart", lambda d: d["result"].update(status="failed", exit_code=1,
                                                                              exitcodes={"0": 1, "1": 0}))
    r = cli("doctor", "runs/quickstart", cwd=run)
    assert r.returncode == 1 and "Traceback" not in r.output, r.output
    assert "rank 0 failed, and its logs are missing" in r.stderr


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


