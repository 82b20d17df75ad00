"""Reading a checkpoint's step without torch (``mgpucli.postmortem.checkpoint_peek``), on checkpoints torch wrote."""

from __future__ import annotations

from pathlib import Path

import torch

from mgpucli.engine.checkpoints import state as st
from mgpucli.engine.checkpoints.files import save_atomic
from mgpucli.postmortem.checkpoint_peek import read_checkpoint_info


def real_payload(step: int, epoch: int, mid_epoch: bool = False) -> dict:
    """What the trainer saves: a model and its optimizer (momentum buffers), a scheduler, every rank's RNG."""
    model = torch.nn.Linear(4, 3)
    optim = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    model(torch.randn(2, 4)).sum().backward()
    optim.step()
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(optim, T_max=10)
    meta = st.build_payload(scheduler=sched.state_dict(), scaler=None, epoch=epoch, step=step, mid_epoch=mid_epoch,
                            per_rank=[{"rng": st.capture_rng(torch.device("cpu")), "loader": None}] * 2,
                            world_size=2, recipe="name: q\n", metrics={"loss": 0.5}, best=0.5, best_metric="loss")
    return {**meta, "model": model.state_dict(), "optimizer": optim.state_dict()}


def test_a_real_checkpoint_gives_its_step_epoch_and_world_size(tmp_path: Path):
    path = tmp_path / "last.pt"
    save_atomic(real_payload(step=40, epoch=2, mid_epoch=True), path)
    info = read_checkpoint_info(str(path))
    assert info is not None and (info.step, info.epoch, info.mid_epoch, info.world_size) == (40, 2, True, 2)


def test_a_sharded_checkpoint_directory_reads_its_meta(tmp_path: Path):
    sharded = tmp_path / "last.dcp"
    sharded.mkdir()
    save_atomic(st.build_payload(epoch=1, step=16, mid_epoch=False, world_size=2), sharded / "meta.pt")
    info = read_checkpoint_info(str(sharded))
    assert info is not None and (info.step, info.epoch) == (16, 1)


def test_truncated_foreign_and_missing_files_read_as_none(tmp_path: Path):
    whole = tmp_path / "whole.pt"
    save_atomic(real_payload(step=8, epoch=0), whole)
    data = whole.read_bytes()
    (tmp_path / "cut.pt").write_bytes(data[: len(data) // 2])  # a copy that stopped half-way
    torch.save({"weight": torch.zeros(2), "step": 3}, tmp_path / "plain.pt")  # not mgpu's (no mgpu_format)
    (tmp_path / "text.pt").write_text("not a checkpoint")
    for name in ("cut.pt", "plain.pt", "text.pt", "absent.pt"):
        assert read_checkpoint_info(str(tmp_path / name)) is None, name
    assert read_checkpoint_info(str(tmp_path)) is None  # a directory without meta.pt


class _Touch:
    """Unpickling this with a normal unpickler creates ``marker``: the reader must not."""

    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return (Path.touch, (self.marker,))


def test_nothing_in_the_file_runs(tmp_path: Path):
    marker = tmp_path / "ran"
    path = tmp_path / "evil.pt"
    torch.save({"mgpu_format": 1, "step": 5, "epoch": 0, "payload": _Touch(marker)}, path)
    info = read_checkpoint_info(str(path))
    assert info is not None and info.step == 5
    assert not marker.exists()


def test_the_resume_check_reads_the_format_the_engine_writes():
    from mgpucli.engine.checkpoints.files import FORMAT_VERSION
    from mgpucli.engine.checkpoints.sharded import META
    from mgpucli.postmortem import checkpoint_peek

    assert (checkpoint_peek.FORMAT_VERSION, checkpoint_peek.SHARDED_META) == (FORMAT_VERSION, META)
