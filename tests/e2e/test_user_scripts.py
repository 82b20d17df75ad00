"""Scripts in the styles users arrive with, run unmodified under ``mgpu launch --cpu --nproc 2`` and ``--audit``: the
PyTorch DDP tutorial's class-based torchrun trainer (snapshot resume, a peek at the loader before ``set_epoch``), an
ImageNet-example-style ``main_worker`` with ``--dist-url env://`` and its own checkpointing, and a script whose data
sharding is torchdata's (``StatefulDataLoader`` + ``StatefulDistributedSampler``, resumed mid-epoch). The audit's
findings are asserted exactly: none for a correct script, each trap at its line for the one left in. The scripts are
in ``tests/e2e/scripts``; processes are tagged and checked as in tests/e2e/test_launch.py."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import torch

from tests.e2e import test_scripts
from tests.e2e.test_audit import live_findings, traps
from tests.e2e.test_launch import run_launch
from tests.e2e.test_scripts import CPU2

work = test_scripts.work  # the fixture: a working directory holding the test scripts


def launched(args: list[str], cwd: Path, tag: str, run_dir: Path, audit: bool) -> str:
    """``mgpu launch --cpu --nproc 2 [--audit] --run-dir RUN_DIR ARGS`` in ``cwd``; its output, once it exited 0."""
    code, launch = run_launch([*CPU2, *(["--audit"] if audit else []), "--run-dir", str(run_dir), *args], cwd, tag,
                              timeout=120, name=run_dir.name)
    assert code == 0, launch.output
    return launch.output


def audit_of(run_dir: Path) -> dict:
    return json.loads((run_dir / "audit.json").read_text())


def assert_no_findings(run_dir: Path, output: str) -> dict:
    """No finding, live or in audit.json; returns what each rank checked."""
    assert "mgpu audit: no findings" in output and not live_findings(output), output
    audit = audit_of(run_dir)
    assert audit["summary"] == [] and audit["findings"] == [], audit
    return {s["rank"]: s["checked"] for s in audit["status"]}


def assert_bitwise_equal(a: dict, b: dict) -> None:
    assert a.keys() == b.keys()
    for key in a:
        assert torch.equal(a[key].view(torch.uint8), b[key].view(torch.uint8)), key


def test_the_ddp_tutorials_trainer_peeking_at_its_loader_has_no_finding_and_the_same_weights(work: Path, tag: str):
    plain_dir = work.parent / "plain"
    shutil.copytree(work, plain_dir)
    out = launched(["tutorial_trainer.py", "3", "1"], work, tag, work / "audited", audit=True)
    assert "[rank0]:[GPU0] Epoch 2 | Batchsize: 32 | Steps: 4" in out, out
    checked = assert_no_findings(work / "audited", out)
    assert checked[0]["optimizer steps"] == 12 and checked[0]["distributed samplers"] == 1, checked
    plain = launched(["tutorial_trainer.py", "3", "1"], plain_dir, tag, plain_dir / "run", audit=False)
    assert "mgpu audit" not in plain
    audited, unaudited = (torch.load(d / "snapshot.pt", weights_only=True) for d in (work, plain_dir))
    assert audited["EPOCHS_RUN"] == unaudited["EPOCHS_RUN"] == 2
    assert_bitwise_equal(audited["MODEL_STATE"], unaudited["MODEL_STATE"])
    resumed = launched(["tutorial_trainer.py", "5", "1"], work, tag, work / "resumed", audit=True)
    assert "[rank0]:Resuming training from snapshot at Epoch 2" in resumed, resumed
    assert "[rank0]:Epoch 4 | Training snapshot saved at snapshot.pt" in resumed
    assert_no_findings(work / "resumed", resumed)
    assert torch.load(work / "snapshot.pt", weights_only=True)["EPOCHS_RUN"] == 4


def test_an_imagenet_style_main_worker_with_env_url_resumes_its_checkpoint_under_audit(work: Path, tag: str):
    args = ["imagenet_style.py", "--dist-url", "env://", "--seed", "0"]
    out = launched([*args, "--epochs", "2"], work, tag, work / "first", audit=False)
    assert "[rank0]:Epoch: [1] loss" in out and "[rank0]: * Acc@1" in out and "over 64" in out, out
    first = torch.load(work / "checkpoint.pth.tar", weights_only=True)
    assert first["epoch"] == 2 and (work / "model_best.pth.tar").is_file()
    resumed = launched([*args, "--epochs", "3", "--resume", "checkpoint.pth.tar"], work, tag, work / "resumed",
                       audit=True)
    assert "[rank0]:=> loaded checkpoint 'checkpoint.pth.tar' (epoch 2)" in resumed, resumed
    assert "[rank0]:Epoch: [2] loss" in resumed and "Epoch: [1]" not in resumed
    checked = assert_no_findings(work / "resumed", resumed)
    assert checked[0]["optimizer steps"] == 8 and checked[0]["distributed samplers"] == 2, checked
    assert torch.load(work / "checkpoint.pth.tar", weights_only=True)["epoch"] == 3


def test_torchdatas_sharding_resumed_mid_epoch_is_judged_as_torchs_with_its_one_trap_found(work: Path, tag: str):
    out = launched(["torchdata_sharded.py", "--stop-after", "6"], work, tag, work / "first", audit=False)
    assert torch.load(work / "ckpt.pt", weights_only=True)["step"] == 4, out
    resumed = launched(["torchdata_sharded.py", "--resume", "ckpt.pt"], work, tag, work / "resumed", audit=True)
    assert "[rank0]:resumed at epoch 0 step 4" in resumed, resumed
    assert "[rank0]:epoch 1 step 16 val" in resumed and "over 102" in resumed  # 101 samples, one counted twice
    (line,) = traps(work / "torchdata_sharded.py").values()
    shown = live_findings(resumed)
    assert len(shown) == 1 and f"torchdata_sharded.py:{line}: padded evaluation" in shown[0], resumed
    audit = audit_of(work / "resumed")
    (group,) = audit["summary"]
    assert group["kind"] == "padded_evaluation" and group["where"] == [f"torchdata_sharded.py:{line}"], group
    assert group["ranks"] == [0, 1] and "over 101 samples on 2 ranks" in group["title"]
    assert all(f["where"]["library"] == "" for f in audit["findings"])  # the user's line, not torchdata's
    checked = {s["rank"]: s["checked"] for s in audit["status"]}
    assert checked[0]["optimizer steps"] == 12 and checked[0]["distributed samplers"] == 2, checked
