"""trainer.strategy=fsdp end to end on 2 CPU processes (gloo): same curves, same checkpoints, exact resume. By
default (trainer.checkpoint_format=auto) FSDP writes sharded checkpoints, which every reader reads."""

from __future__ import annotations

import json

import pytest
import torch

from tests.inproc import cli
from tests.procs import RECIPES, load_ckpt, mgpu, torchrun

CHARLM = str(RECIPES / "charlm.yaml")
TINY = ["vars.block_size=32", "model.d_model=32", "model.n_head=2", "+data.train.num_chars=12000",
        "+data.val.num_chars=6000", "data.batch_size=8", "trainer.log_every=5", "trainer.cpu_threads=1"]


def losses(run_dir, split):
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    return [m["loss"] for m in map(json.loads, lines) if m["split"] == split]


@pytest.fixture(scope="module")
def fsdp_and_ddp(tmp_path_factory):
    cwd = tmp_path_factory.mktemp("fsdp")
    for strategy in ("fsdp", "ddp"):
        r = torchrun(2, "train", CHARLM, *TINY, "trainer.max_steps=20", f"trainer.strategy={strategy}",
                     f"run_dir={strategy}", cwd=cwd)
        assert r.returncode == 0, r.output
    # the default under FSDP: each rank wrote its shards, none gathered the model (other tests resume run_dir=fsdp)
    assert (cwd / "fsdp/checkpoints/last.dcp").is_symlink() and not (cwd / "fsdp/checkpoints/last.pt").exists()
    r = cli("convert", "fsdp/checkpoints/last.dcp", "fsdp-step20.pt", cwd=cwd)  # one file, in this process
    assert r.returncode == 0 and "as one file: fsdp-step20.pt" in r.stderr, r.output
    return cwd


def test_fsdp_follows_the_ddp_loss_curve(fsdp_and_ddp):
    a, b = losses(fsdp_and_ddp / "fsdp", "train"), losses(fsdp_and_ddp / "ddp", "train")
    assert len(a) == len(b) == 4
    assert a == pytest.approx(b, rel=1e-5)
    assert a[-1] < a[0]  # it learns
    ck = load_ckpt(fsdp_and_ddp / "fsdp-step20.pt")
    assert ck["world_size"] == 2 and "blocks.0.qkv.weight" in ck["model"]  # converted: full, clean keys
    assert ck["model"]["blocks.0.qkv.weight"].shape == (96, 32)


def test_fsdp_checkpoint_validates_on_one_and_two_processes_like_ddp(fsdp_and_ddp):
    results = {}
    for name, path in (("fsdp", "fsdp/checkpoints/last.dcp"), ("ddp", "ddp/checkpoints/last.pt"),
                       ("converted", "fsdp-step20.pt")):
        r = cli("validate", path, "--json", cwd=fsdp_and_ddp)  # one process: this one
        assert r.returncode == 0, r.output
        results[name] = json.loads(r.stdout)
    two = mgpu("validate", "fsdp/checkpoints/last.dcp", "--cpu", "--nproc", "2", "--json", cwd=fsdp_and_ddp)
    assert two.returncode == 0, two.output
    on_two = json.loads(two.stdout)
    assert on_two["processes"] == 2 and on_two["checkpoint"]["step"] == 20
    assert on_two["metrics"] == results["fsdp"]["metrics"] == results["converted"]["metrics"]  # identical
    assert results["fsdp"]["samples"] == results["ddp"]["samples"] == on_two["samples"]
    assert results["fsdp"]["metrics"]["loss"] == pytest.approx(results["ddp"]["metrics"]["loss"], rel=1e-5)
    # and the 2-process FSDP validation during training saw the same
    assert losses(fsdp_and_ddp / "fsdp", "val")[-1] == pytest.approx(results["fsdp"]["metrics"]["loss"], rel=1e-6)


def test_ddp_resumes_from_an_fsdp_checkpoint_and_back(fsdp_and_ddp):
    r = torchrun(2, "train", CHARLM, *TINY, "trainer.max_steps=25", "trainer.strategy=ddp", "run_dir=fsdp",
                 "--resume", "auto", cwd=fsdp_and_ddp)
    assert r.returncode == 0, r.output
    r = torchrun(2, "train", CHARLM, *TINY, "trainer.max_steps=25", "trainer.strategy=fsdp", "run_dir=ddp",
                 "--resume", "auto", cwd=fsdp_and_ddp)
    assert r.returncode == 0, r.output
    # each run dir keeps its format: DDP went on writing the FSDP run's shards, FSDP the DDP run's file
    assert not (fsdp_and_ddp / "fsdp/checkpoints/last.pt").exists()
    a, b = load_ckpt(fsdp_and_ddp / "fsdp/checkpoints/last.dcp"), load_ckpt(fsdp_and_ddp / "ddp/checkpoints/last.pt")
    assert a["step"] == b["step"] == 25
    for key in a["model"]:
        torch.testing.assert_close(a["model"][key], b["model"][key], rtol=1e-3, atol=1e-4)  # float order differs


def test_fsdp_resume_from_full_checkpoints_equals_uninterrupted(fsdp_and_ddp):
    """trainer.checkpoint_format=full under FSDP (rank 0 gathers one file): bitwise the sharded run, converted."""
    args = [*TINY, "trainer.strategy=fsdp", "trainer.checkpoint_format=full", "run_dir=part"]
    part = torchrun(2, "train", CHARLM, *args, "trainer.max_steps=7", cwd=fsdp_and_ddp)
    assert part.returncode == 0, part.output
    resumed = torchrun(2, "train", CHARLM, *args, "trainer.max_steps=20", "--resume", "auto", cwd=fsdp_and_ddp)
    assert resumed.returncode == 0, resumed.output
    a, b = load_ckpt(fsdp_and_ddp / "fsdp-step20.pt"), load_ckpt(fsdp_and_ddp / "part/checkpoints/last.pt")
    assert a["step"] == b["step"] == 20
    assert all(torch.equal(a["model"][k], b["model"][k]) for k in a["model"])
    for key, value in a["optimizer"]["state"].items():
        assert torch.equal(value["exp_avg"], b["optimizer"]["state"][key]["exp_avg"])


def test_sharded_checkpoint_round_trips(fsdp_and_ddp):
    """Stopped at step 6 in shards, resumed from them to step 20: the uninterrupted FSDP run's weights, bitwise."""
    args = [*TINY, "trainer.strategy=fsdp", "run_dir=sharded"]
    part = torchrun(2, "train", CHARLM, *args, "trainer.max_steps=6", cwd=fsdp_and_ddp)
    assert part.returncode == 0, part.output
    ckpts = fsdp_and_ddp / "sharded/checkpoints"
    assert (ckpts / "last.dcp").is_symlink() and (ckpts / "last.dcp/meta.pt").exists()
    assert not list(ckpts.glob(".*"))  # no temporary directory under any name
    resumed = torchrun(2, "train", CHARLM, *args, "trainer.max_steps=20", "--resume", "auto", cwd=fsdp_and_ddp)
    assert resumed.returncode == 0, resumed.output
    assert "resumed from" in resumed.stderr and "last.dcp" in resumed.stderr
    a = load_ckpt(fsdp_and_ddp / "fsdp-step20.pt")["model"]
    b = load_ckpt(fsdp_and_ddp / "sharded/checkpoints/last.dcp")["model"]
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_an_option_that_does_not_combine_is_exit_2_once(tmp_path):
    r = torchrun(2, "train", CHARLM, *TINY, "trainer.max_steps=2", "trainer.strategy=fsdp",
                 "trainer.fsdp.cpu_offload=true", cwd=tmp_path)
    assert r.returncode != 0
    assert r.stderr.count("trainer.fsdp.cpu_offload needs CUDA GPUs") == 1, r.stderr  # rank 0 alone says it
    assert "mgpucli/engine" not in r.stderr  # no traceback from the workers
