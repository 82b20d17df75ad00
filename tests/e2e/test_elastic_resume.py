"""Resuming on another number of processes: the epoch goes on with exactly the samples not yet seen, on the same
global batch (trainer.grad_accum changed to keep it), and ends close to the uninterrupted run (docs/launch.md
gives the tolerance, measured on the quickstart recipe); a global batch no whole grad_accum keeps is exit 2."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from tests.inproc import COMPOSE_CHILD, cli
from tests.procs import RECIPES, assert_usage_error, load_ckpt, mgpu, torchrun

QUICK = str(RECIPES / "quickstart.yaml")
CHARLM = str(RECIPES / "charlm.yaml")
# 1024 samples, a global batch of 64: 16 steps, no padding. One fixed schedule for the stopped and the whole runs.
SMALL = ["data.train.num_samples=1024", "data.val.num_samples=301", "trainer.log_every=4", "trainer.cpu_threads=1",
         "trainer.epochs=1", "scheduler.T_max=16"]
# The tolerances docs/launch.md states for weights after a resume on another process count (float reduction order,
# which AdamW amplifies where a gradient's second moment is still tiny).
QUICK_TOL = {"rtol": 0.0, "atol": 1e-6}
CHARLM_TOL = {"rtol": 1e-3, "atol": 1e-4}

RECORDING = '''
import os
from mgpucli.components.datasets import SyntheticClassification

class Recorded(SyntheticClassification):
    """Appends every index it serves to record_dir/<pid>.txt."""

    def __init__(self, record_dir, **kwargs):
        super().__init__(**kwargs)
        self.record_dir = record_dir

    def __getitem__(self, i):
        os.makedirs(self.record_dir, exist_ok=True)
        with open(os.path.join(self.record_dir, f"{os.getpid()}.txt"), "a") as fh:
            fh.write(f"{i}\\n")
        return super().__getitem__(i)
'''


def recorded(name: str) -> list[str]:
    return ["data.train._target_=seen_data.Recorded", f"+data.train.record_dir={name}"]


def served(directory: Path) -> list[int]:
    return [int(line) for f in sorted(directory.glob("*.txt")) for line in f.read_text().split()]


def assert_weights_close(a: dict, b: dict, tolerance: dict) -> None:
    assert a.keys() == b.keys()
    for key in a:
        torch.testing.assert_close(a[key], b[key], **tolerance)


@pytest.fixture(scope="module")
def cwd(tmp_path_factory):
    path = tmp_path_factory.mktemp("elastic")
    (path / "seen_data.py").write_text(RECORDING)
    return path


def one(*args: str, cwd: Path):
    """One process: ``mgpu train`` in the test process (the other process count is torchrun's 2 real ranks)."""
    return cli("train", QUICK, *SMALL, *args, cwd=cwd)


def two(*args: str, cwd: Path):
    return torchrun(2, "train", QUICK, *SMALL, *args, cwd=cwd)


@pytest.mark.parametrize("first, then", [(two, one), (one, two)])
def test_another_process_count_sees_each_sample_once_and_keeps_the_global_batch(cwd, first, then):
    """2 processes x 32 stopped at step 5, resumed on 1 process x 32 x grad_accum 2; and the reverse."""
    name = f"{first.__name__}-{then.__name__}"
    start = ["trainer.grad_accum=2"] if first is one else []  # a global batch of 64 either way
    whole = first(*start, f"run_dir={name}-whole", cwd=cwd)
    assert whole.returncode == 0, whole.output
    part = first(*start, *recorded(f"{name}-a"), "trainer.max_steps=5", f"run_dir={name}", cwd=cwd)
    assert part.returncode == 0, part.output
    resumed = then(*recorded(f"{name}-b"), f"run_dir={name}", "--resume", "auto", cwd=cwd)
    assert resumed.returncode == 0, resumed.output
    processes = 1 if then is one else 2
    assert f"keeping the checkpoint's global batch 64: {3 - processes} process(es) x 32 x grad_accum " \
           f"{processes} then, {processes} process(es) x 32 x grad_accum {3 - processes} now" in resumed.stderr
    assert "epoch 1 goes on after the 320 of its 1024 samples already trained on" in resumed.stderr
    assert f"steps 1-5 on {3 - processes} process(es)" in resumed.stderr
    assert f"from step 6 on {processes} process(es) (global batch 64 = {processes} x 32 x grad_accum " \
           f"{3 - processes})" in resumed.stderr
    before, after = served(cwd / f"{name}-a"), served(cwd / f"{name}-b")
    assert len(before) == 320 and sorted(before + after) == list(range(1024))  # every sample exactly once
    a, b = load_ckpt(cwd / f"{name}-whole/checkpoints/last.pt"), load_ckpt(cwd / f"{name}/checkpoints/last.pt")
    assert a["step"] == b["step"] == 16 and b["world_size"] == processes
    assert [(s["first_step"], s["world_size"], s["grad_accum"]) for s in b["segments"]] == \
        [(1, 3 - processes, processes), (6, processes, 3 - processes)]
    assert_weights_close(a["model"], b["model"], QUICK_TOL)
    if then is one:  # mgpu validate reads such a checkpoint as any other
        validated = cli("validate", f"{name}/checkpoints/last.pt", "--json", "--trust-recipe", cwd=cwd)
        assert validated.returncode == 0 and json.loads(validated.stdout)["samples"] == 301, validated.output


def test_a_global_batch_no_whole_grad_accum_keeps_is_refused_with_the_options(cwd):
    three = torchrun(3, "train", QUICK, *SMALL, "trainer.max_steps=2", "run_dir=three", cwd=cwd)
    assert three.returncode == 0, three.output
    r = cli("launch", "--cpu", "--nproc", "2", QUICK, *SMALL, "run_dir=three", "--resume", "auto", cwd=cwd,
            allowed=(COMPOSE_CHILD,))  # refused before any worker: no process but the recipe's compose child
    assert_usage_error(r, "global batch of 96", "no whole trainer.grad_accum keeps it",
                       "data.batch_size=48 trainer.grad_accum=1", "run on 1 or 3 process(es)")
    assert load_ckpt(cwd / "three/checkpoints/last.pt")["step"] == 2  # nothing trained, nothing written
    accepted = mgpu("launch", "--cpu", "--nproc", "2", QUICK, *SMALL, "run_dir=three", "trainer.grad_accum=1",
                    "trainer.max_steps=3", "--resume", "auto", cwd=cwd, timeout=180)
    assert accepted.returncode == 0, accepted.output
    assert "the global batch changes from 96" in accepted.stderr and "to 64" in accepted.stderr
    doctor = cli("doctor", "three", cwd=cwd)
    assert doctor.returncode == 0, doctor.output
    assert ("trained: steps 1-2 on 3 process(es) (global batch 96 = 3 x 32 x grad_accum 1), step 3 on 2 process(es) "
            "(global batch 64 = 2 x 32 x grad_accum 1)") in " ".join(doctor.stderr.split())


def test_fsdp_sharded_checkpoints_resume_on_one_process_with_the_global_batch_and_the_optimizer_state(cwd):
    """FSDP's default, sharded checkpoints: the shards of 2 processes load on 1 (torch.distributed.checkpoint), which
    keeps writing sharded checkpoints, so --resume auto finds the newest."""
    tiny = ["vars.block_size=32", "model.d_model=32", "model.n_head=2", "+data.train.num_chars=12000",
            "+data.val.num_chars=3000", "trainer.log_every=5", "trainer.cpu_threads=1", "trainer.strategy=fsdp",
            "data.val=null", "trainer.best_metric=null"]  # 337 samples, a global batch of 32: 10 full steps
    whole = torchrun(2, "train", CHARLM, *tiny, "trainer.max_steps=10", "run_dir=fsdp-whole", cwd=cwd)
    assert whole.returncode == 0, whole.output
    sharded = [*tiny, "run_dir=fsdp"]
    part = torchrun(2, "train", CHARLM, *sharded, "trainer.max_steps=5", cwd=cwd)
    assert part.returncode == 0, part.output
    resumed = cli("train", CHARLM, *sharded, "trainer.max_steps=10", "--resume", "auto", cwd=cwd)  # 1 process
    assert resumed.returncode == 0, resumed.output
    assert "resumed from fsdp/checkpoints/last.dcp at step 5" in resumed.stderr
    assert "keeping the checkpoint's global batch 32" in resumed.stderr and "grad_accum=2" in resumed.stderr
    assert not (cwd / "fsdp/checkpoints/last.pt").exists()
    a, b = load_ckpt(cwd / "fsdp-whole/checkpoints/last.dcp"), load_ckpt(cwd / "fsdp/checkpoints/last.dcp")
    assert a["step"] == 10
    assert_weights_close(a["model"], b["model"], CHARLM_TOL)
    for key, value in a["optimizer"]["state"].items():
        torch.testing.assert_close(value["exp_avg"], b["optimizer"]["state"][key]["exp_avg"], **CHARLM_TOL)
    records = [json.loads(line) for line in (cwd / "fsdp/metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records if r["split"] == "train"] == [5, 10]
