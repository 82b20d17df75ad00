"""The run-dir rule every start applies (launcher, --check, --dry-run, the worker's rank 0): one rule, one message."""

from __future__ import annotations

import pytest

from mgpucli.errors import UsageError
from mgpucli.run_files import check_start, holds_a_run, unwritable


def _with_checkpoint(run_dir, name="last.pt"):
    (run_dir / "checkpoints").mkdir(parents=True)
    (run_dir / "checkpoints" / name).write_bytes(b"x")


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
        check_start(tmp_path, "auto", False)


def test_sharded_runs_resume_their_checkpoint_directory(tmp_path):
    (tmp_path / "checkpoints" / "last.dcp").mkdir(parents=True)
    assert check_start(tmp_path, "auto", False, sharded=True) == tmp_path / "checkpoints" / "last.dcp"


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
