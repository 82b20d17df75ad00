"""Checkpoint I/O: atomic writes, safe reads, key normalisation, fit checks."""

from __future__ import annotations

import os
import pickle

import pytest
import torch

from mgpucli.engine.checkpoints.files import (
    DiskWriteError,
    check_model_fit,
    clean_stale_temps,
    normalize_keys,
    read_file,
    save_atomic,
)
from mgpucli.engine.checkpoints.state import capture_rng, recipe_changes, restore_rng
from mgpucli.errors import CheckpointError


def test_save_atomic_round_trips_with_weights_only(tmp_path):
    path = tmp_path / "last.pt"
    save_atomic({"model": {"w": torch.ones(2)}, "step": 3}, path)
    assert read_file(path)["step"] == 3
    assert [p.name for p in tmp_path.iterdir()] == ["last.pt"]  # no temp file left


def test_disk_full_mid_save_keeps_the_previous_file(tmp_path, monkeypatch):
    path = tmp_path / "last.pt"
    save_atomic({"step": 1}, path)
    monkeypatch.setenv("MGPU_FAULT", "disk_full_in_save")
    with pytest.raises(DiskWriteError) as info:
        save_atomic({"step": 2}, path)
    assert "previous checkpoint is kept" in str(info.value)
    monkeypatch.delenv("MGPU_FAULT")
    assert read_file(path)["step"] == 1 and len(list(tmp_path.iterdir())) == 1


def test_stale_temp_files_are_cleaned(tmp_path):
    (tmp_path / ".last.pt.tmp-12345").write_bytes(b"half")
    (tmp_path / "last.pt").write_bytes(b"keep")
    assert [p.name for p in clean_stale_temps(tmp_path)] == [".last.pt.tmp-12345"]
    assert [p.name for p in tmp_path.iterdir()] == ["last.pt"]


class _Payload:
    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def test_a_pickle_that_would_run_code_is_refused_and_never_runs(tmp_path):
    marker = tmp_path / "pwned"
    evil = _Payload()
    evil.marker = marker
    path = tmp_path / "evil.pt"
    torch.save({"model": evil}, path)
    with pytest.raises(CheckpointError) as info:
        read_file(path)
    assert "would call posix.system" in str(info.value) or "would call os.system" in str(info.value)
    assert not marker.exists()


def test_empty_file(tmp_path):
    path = tmp_path / "x.pt"
    path.write_bytes(b"")
    with pytest.raises(CheckpointError, match="empty \\(0 bytes\\)"):
        read_file(path)


@pytest.mark.parametrize("header", [b"", b"\x80\x02", b"\x80\x04", b"PK\x03\x04"],
                         ids=["raw", "pickle2", "pickle4", "zip"])
def test_garbage_is_always_a_checkpoint_error(tmp_path, header):
    """Unpickling garbage can raise anything (IndexError, KeyError, struct.error, ...): every one of them must
    come out as the same CheckpointError, never a traceback. Seeded, so a failure reproduces."""
    import random
    rng = random.Random(1234)
    path = tmp_path / "x.pt"
    for size in [1, 2, 7, 64, 256, 4096] * 40:
        path.write_bytes(header + rng.randbytes(size))
        with pytest.raises(CheckpointError, match="not a readable checkpoint"):
            read_file(path)


def test_truncated_file(tmp_path):
    path = tmp_path / "x.pt"
    torch.save({"w": torch.randn(1000)}, path)
    path.write_bytes(path.read_bytes()[:2000])
    with pytest.raises(CheckpointError, match="not a readable checkpoint"):
        read_file(path)


def test_missing_file(tmp_path):
    with pytest.raises(CheckpointError, match="does not exist"):
        read_file(tmp_path / "nope.pt")


def test_plain_pickle_of_data_is_readable_but_not_code(tmp_path):
    path = tmp_path / "x.pt"
    path.write_bytes(pickle.dumps({"a": 1}))
    with pytest.raises(CheckpointError):
        read_file(path)  # not a torch zip file


def test_normalize_strips_ddp_and_compile_prefixes():
    state = {"module.a.weight": 1, "_orig_mod.module.b": 2, "module._orig_mod.c": 3, "d.module.e": 4}
    assert normalize_keys(state) == {"a.weight": 1, "b": 2, "c": 3, "d.module.e": 4}


def test_fit_check_lists_missing_unexpected_and_mismatched_keys():
    expected = {"a": torch.zeros(2, 3), "b": torch.zeros(3), "c": torch.zeros(1)}
    loaded = {"a": torch.zeros(3, 3), "b": torch.zeros(3), "z": torch.zeros(1)}
    with pytest.raises(CheckpointError) as info:
        check_model_fit(expected, loaded, "ckpt.pt")
    text = str(info.value)
    assert "missing from the checkpoint (1): c" in text
    assert "unexpected in the checkpoint (1): z" in text
    assert "shape mismatch (1): a (checkpoint (3, 3), model (2, 3))" in text


def test_rng_state_round_trips_through_a_weights_only_file(tmp_path):
    import random

    import numpy as np

    state = capture_rng(torch.device("cpu"))
    path = tmp_path / "rng.pt"
    save_atomic({"rng": state}, path)
    expected = (torch.rand(3), np.random.rand(3), random.random())
    restore_rng(read_file(path)["rng"], torch.device("cpu"))
    got = (torch.rand(3), np.random.rand(3), random.random())
    assert torch.equal(expected[0], got[0]) and (expected[1] == got[1]).all() and expected[2] == got[2]


def test_recipe_changes_lists_changed_keys():
    old = "name: a\ntrainer:\n  epochs: 1\n  lr: 0.1\n"
    new = "name: a\ntrainer:\n  epochs: 2\n  lr: 0.1\nextra: 1\n"
    assert recipe_changes(old, new) == ["extra", "trainer.epochs"]
