"""GPU paths of train and validate (nccl, set_device, DataParallel, bf16 autocast). Skipped without CUDA."""

from __future__ import annotations

import json

import pytest

from tests.procs import RECIPES, load_ckpt, mgpu

QUICK = str(RECIPES / "quickstart.yaml")
SMALL = ["data.train.num_samples=1024", "data.val.num_samples=301", "trainer.max_steps=20"]

pytestmark = pytest.mark.gpu


def _gpus() -> int:
    import torch

    return torch.cuda.device_count()


def test_single_gpu_train_and_validate(tmp_path):
    r = mgpu("train", QUICK, *SMALL, "trainer.device=cuda", "trainer.precision=bf16", cwd=tmp_path)
    assert r.returncode == 0, r.output
    assert "on cuda:0" in r.stderr and "backend none" in r.stderr
    ckpt = load_ckpt(tmp_path / "runs/quickstart/checkpoints/last.pt")
    assert all(t.device.type == "cpu" for t in ckpt["model"].values())  # saved CPU-side, loads anywhere
    v = mgpu("validate", "runs/quickstart/checkpoints/last.pt", "--gpus", "1", "--json", cwd=tmp_path)
    assert v.returncode == 0, v.output
    assert json.loads(v.stdout)["samples"] == 301 and json.loads(v.stdout)["device"].startswith("cuda")


def test_launch_ddp_on_all_gpus_uses_nccl(tmp_path):
    r = mgpu("launch", "--gpus", "all", QUICK, *SMALL, cwd=tmp_path, timeout=300)
    assert r.returncode == 0, r.output
    assert f"{_gpus()} process(es) on cuda:0 (backend nccl" in r.output


def test_dp_spans_the_gpus_in_one_process(tmp_path):
    r = mgpu("train", QUICK, *SMALL, "trainer.strategy=dp", cwd=tmp_path)
    assert r.returncode == 0, r.output
    assert "strategy dp" in r.stderr
    ckpt = load_ckpt(tmp_path / "runs/quickstart/checkpoints/last.pt")
    assert not any(k.startswith("module.") for k in ckpt["model"])
