"""The run-dir rule every start applies (launcher, --check, --dry-run, the worker's rank 0): one rule, one message."""

from __future__ import annotations

import pytest
import torch

from mgpucli.errors import UsageError
from mgpucli.run_files import check_start, holds_a_run, saved_checkpoint, unwritable, writes_sharded
from mgpucli.run_layout import (
    is_launch_json,
    launch_json_name,
    launcher_name,
    record_node_rank,
    step_glob,
    step_name,
)


def _with_checkpoint(run_dir, name="last.pt"):
    (run_dir / "checkpoints").mkdir(parents=True)
    _checkpoint(run_dir / "checkpoints" / name)


def _checkpoint(path, **fields):
    """A file shaped like mgpu's checkpoints (what the resume check reads), written by torch.save."""
    payload = {"mgpu_format": 1, "step": 4, "epoch": 1, "model": {"w": torch.zeros(2)}, "optimizer": {}, **fields}
    torch.save({k: v for k, v in payload.items() if v is not None}, path)


def test_a_new_or_empty_run_dir_is_a_fresh_start(tmp_path):
    assert check_start(tmp_path / "new" / "run", None, False) is None
    assert check_start(tmp_path, "auto", False) is None  # --resume auto without a checkpoint: fresh
    assert not holds_a_run(tmp_path)


def test_checkpoints_without_resume_or_overwrite_are_refused_with_the_fixes(tmp_path):
    _with_checkpoint(tmp_path)
    assert holds_a_run(tmp_path)
    with pytest.raises(UsageError) as err:
        check_start(tmp_path, None, False)
    assert "already holds checkpoints (last.pt)" in err.value.message
    assert all(fix in err.value.hint for fix in ("--resume auto", "--overwrite", "run_dir=", "name="))
    assert check_start(tmp_path, "auto", False) == tmp_path / "checkpoints" / "last.pt"
    assert check_start(tmp_path, None, True) is None


def test_only_other_checkpoints_still_refuse_a_fresh_start(tmp_path):
    _with_checkpoint(tmp_path, "best.pt")  # --resume auto finds no last.pt: it would start afresh over best.pt
    with pytest.raises(UsageError, match="already holds checkpoints"):
        check_start(tmp_path, None, False)
    with pytest.raises(UsageError, match=r"--resume auto continues from .*last.pt, which does not exist; run dir "
                       r".* holds best.pt \(trainer.checkpoint_format=full\)") as err:
        check_start(tmp_path, "auto", False)
    assert "--resume PATH" in err.value.hint and "--overwrite" in err.value.hint


def test_sharded_runs_resume_their_checkpoint_directory(tmp_path):
    (tmp_path / "checkpoints" / "step-00000004.dcp").mkdir(parents=True)
    _checkpoint(tmp_path / "checkpoints" / "step-00000004.dcp" / "meta.pt", model=None, optimizer=None)
    (tmp_path / "checkpoints" / "last.dcp").symlink_to("step-00000004.dcp")
    assert check_start(tmp_path, "auto", False, sharded=True) == tmp_path / "checkpoints" / "last.dcp"


def test_a_sharded_runs_link_to_a_deleted_step_is_named(tmp_path):
    (tmp_path / "checkpoints").mkdir()
    (tmp_path / "checkpoints" / "last.dcp").symlink_to("step-00000010.dcp")
    with pytest.raises(UsageError, match=r"continues from .*last.dcp \(a link to step-00000010.dcp, which is gone\)"):
        check_start(tmp_path, "auto", False, sharded=True)
    with pytest.raises(UsageError, match=r"no such checkpoint \(a link to step-00000010.dcp, which is gone\)"):
        check_start(tmp_path, str(tmp_path / "checkpoints" / "last.dcp"), False, sharded=True)


def test_auto_format_resumes_whichever_the_run_dir_holds_and_keeps_writing_it(tmp_path):
    """trainer.checkpoint_format=auto (sharded=None): --resume auto continues last.pt or last.dcp, and the run keeps
    that format; a new run writes sharded checkpoints under FSDP alone."""
    full, sharded = tmp_path / "full", tmp_path / "sharded"
    _with_checkpoint(full)
    (sharded / "checkpoints" / "step-00000004.dcp").mkdir(parents=True)
    _checkpoint(sharded / "checkpoints" / "step-00000004.dcp" / "meta.pt", model=None, optimizer=None)
    (sharded / "checkpoints" / "last.dcp").symlink_to("step-00000004.dcp")
    found_full, found_sharded = check_start(full, "auto", False, None), check_start(sharded, "auto", False, None)
    assert (found_full.name, found_sharded.name) == ("last.pt", "last.dcp")
    assert not writes_sharded("auto", "fsdp", found_full) and writes_sharded("auto", "ddp", found_sharded)
    assert writes_sharded("auto", "fsdp", None) and not writes_sharded("auto", "ddp", None)
    assert writes_sharded("sharded", "fsdp", found_full) and not writes_sharded("full", "fsdp", found_sharded)
    (sharded / "checkpoints" / "step-00000004.dcp").rename(sharded / "checkpoints" / "step-00000002.dcp")
    with pytest.raises(UsageError, match=r"continues from .*last.dcp \(a link to step-00000004.dcp, which is gone\); "
                       r"run dir .* holds .*\(trainer.checkpoint_format=auto\)"):
        check_start(sharded, "auto", False, None)


@pytest.mark.parametrize("fields, problem", [
    ({"mgpu_format": None}, "is not an mgpu checkpoint"),
    ({"mgpu_format": 2}, "was written by a newer mgpu (checkpoint format 2; this mgpu reads format 1)"),
    ({"optimizer": None}, "has no optimizer: not a complete mgpu checkpoint"),
    ({"step": "4"}, "holds a step or epoch that is not a number"),
])
def test_a_resume_checkpoint_is_read_before_anything_starts(tmp_path, fields, problem):
    _checkpoint(tmp_path / "c.pt", **fields)
    with pytest.raises(UsageError) as err:
        check_start(tmp_path / "run", str(tmp_path / "c.pt"), False)
    assert problem in err.value.message and "start afresh without --resume" in err.value.hint
    (tmp_path / "empty.pt").write_bytes(b"")
    with pytest.raises(UsageError, match="is empty"):
        check_start(tmp_path / "run", str(tmp_path / "empty.pt"), False)
    with pytest.raises(UsageError, match="--resume is empty"):
        check_start(tmp_path / "run", "", False)
    assert not (tmp_path / "run").exists()


def test_a_missing_resume_target_and_resume_with_overwrite_are_refused(tmp_path):
    with pytest.raises(UsageError, match="no such checkpoint"):
        check_start(tmp_path, str(tmp_path / "gone.pt"), False)
    with pytest.raises(UsageError, match="contradict"):
        check_start(tmp_path, "auto", True)


def test_a_run_dir_under_a_file_cannot_be_created(tmp_path):
    (tmp_path / "f").write_text("")
    assert unwritable(tmp_path / "f" / "run") == f"{tmp_path / 'f'} is a file, not a directory"
    with pytest.raises(UsageError, match="cannot create run dir"):
        check_start(tmp_path / "f" / "run", None, False)
    assert not (tmp_path / "f").is_dir()  # nothing was created


def test_the_runs_newest_and_best_checkpoints_are_found_in_either_format_and_only_when_complete(tmp_path):
    ckpts = tmp_path / "checkpoints"
    assert saved_checkpoint(tmp_path) is None and saved_checkpoint(tmp_path, "best") is None  # no checkpoints/
    (ckpts / "step-00000004.dcp").mkdir(parents=True)
    (ckpts / "last.dcp").symlink_to("step-00000004.dcp")
    assert saved_checkpoint(tmp_path) is None  # a sharded one whose meta file is not written yet is not one
    (ckpts / "step-00000004.dcp" / "meta.pt").write_bytes(b"x")
    assert saved_checkpoint(tmp_path) == ckpts / "last.dcp" and saved_checkpoint(tmp_path, "best") is None
    (ckpts / "last.pt").write_bytes(b"x")
    (ckpts / "best.pt").write_bytes(b"x")
    assert saved_checkpoint(tmp_path) == ckpts / "last.pt" and saved_checkpoint(tmp_path, "best") == ckpts / "best.pt"


def test_the_run_dirs_derived_names():
    assert (step_name(40, sharded=False), step_name(40, sharded=True)) == ("step-00000040.pt", "step-00000040.dcp")
    assert step_glob(sharded=False) == "step-*.pt"
    names = {(1, None): "launch.json", (2, 0): "launch.json", (2, 3): "launch.node3.json",
             (2, None): "launch.h-1a2b3c.json"}
    assert {key: launch_json_name(*key, launcher="h-1a2b3c") for key in names} == names
    assert launcher_name("gpu-7.example.com", "1a2b3c") == "gpu-7.example.com-1a2b3c"
    assert launcher_name("a b/c", "x") == "a_b_c-x"  # kept to the characters safe in a file name
    records = ("launch.json", "launch.node12.json", "launch.h-1a2b3c.json", "launch.h.json")  # the last: earlier
    others = ("launch..json", "xlaunch.json", "launch.json.tmp123", "launch.h.json.tmp9", "launch-abc")
    assert all(map(is_launch_json, records)) and not any(map(is_launch_json, others))
    assert [record_node_rank(n) for n in records] == [0, 12, None, None]
