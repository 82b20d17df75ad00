"""The trainer's optional features for real: activation checkpointing, EMA, early stopping, the profiler window.

Real ``mgpu train`` processes (alone or under torchrun, gloo on CPU), real files under tmp_path.
"""

from __future__ import annotations

import json
import os
import signal

import pytest
import torch

from tests.e2e.test_launch import Launch, run_launch, wait_until
from tests.inproc import cli
from tests.procs import RECIPES, load_ckpt, mgpu, torchrun

QUICK = str(RECIPES / "quickstart.yaml")
CHARLM = str(RECIPES / "charlm.yaml")
# charlm small enough for seconds per run on 2 cores; dropout makes the RNG matter; 1 thread per rank on both sides
CHARLM_SMALL = ["+data.train.num_chars=20000", "+data.val.num_chars=8000", "trainer.max_steps=6",
                "trainer.log_every=1", "+model.dropout=0.1", "trainer.cpu_threads=1"]


def metrics(run_dir) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def test_activation_checkpointing_under_ddp_keeps_the_loss_curve(tmp_path):
    plain = torchrun(2, "train", CHARLM, *CHARLM_SMALL, "run_dir=plain", cwd=tmp_path)
    assert plain.returncode == 0, plain.output
    ckpt = torchrun(2, "train", CHARLM, *CHARLM_SMALL, "trainer.activation_checkpointing=true", "run_dir=ac",
                    cwd=tmp_path)
    assert ckpt.returncode == 0, ckpt.output
    assert "activation checkpointing: 2 block(s)" in ckpt.stderr and "strategy ddp" in ckpt.stderr
    curves = {name: [(m["step"], m["loss"]) for m in metrics(tmp_path / name) if m["split"] == "train"]
              for name in ("plain", "ac")}
    assert len(curves["ac"]) >= 6
    assert curves["ac"] == curves["plain"]  # bitwise: recomputation replays the same ops and dropout masks
    a, b = load_ckpt(tmp_path / "plain/checkpoints/last.pt"), load_ckpt(tmp_path / "ac/checkpoints/last.pt")
    assert a["model"].keys() == b["model"].keys()  # the same parameter names: checkpoints interchange
    assert all(torch.equal(a["model"][k], b["model"][k]) for k in a["model"])


# 2 epochs of 16 steps at 2 x 32; the average moves visibly (decay 0.9) and is what validation sees
EMA_RUN = ["--cpu", "--nproc", "2", "quickstart", "data.train.num_samples=1024", "data.val.num_samples=301",
           "trainer.epochs=2", "trainer.log_every=4", "trainer.cpu_threads=1", "trainer.ema.decay=0.9",
           "trainer.ema.validate=true"]
HELD_STEP = 20  # mid-epoch 2: rank 1 holds in this step until the stop signal reaches it (mgpucli/faults.py)


def rank_progress(run_dir, rank: int) -> dict | None:
    """The rank's heartbeat (``mgpu_progress.json`` beside its logs, rewritten every second): its step and phase."""
    found = sorted(run_dir.glob(f"logs/*/attempt_0/{rank}/mgpu_progress.json"))
    try:
        return json.loads(found[-1].read_text()) if found else None
    except (OSError, ValueError):  # caught between two writes
        return None


def test_ema_resumes_bitwise_after_sigterm_and_validates_as_logged(tmp_path, tag):
    code, straight = run_launch([*EMA_RUN, f"run_dir={tmp_path / 'straight'}"], tmp_path, tag, name="straight")
    assert code == 0, straight.output
    run_dir = tmp_path / "stopped"
    # rank 1 holds in step HELD_STEP until the signal comes: the SIGTERM lands mid-epoch, at a known step, no race
    launch = Launch([*EMA_RUN, f"run_dir={run_dir}"], tmp_path, tag, name="stopped",
                    env={"MGPU_FAULT": f"hold_step@rank=1@step={HELD_STEP}", "MGPU_FAULT_SLEEP": "300"})
    try:
        def held() -> bool:
            assert launch.proc.poll() is None, launch.output
            return ((rank_progress(run_dir, 1) or {}).get("step")) == HELD_STEP

        assert wait_until(held, 120), launch.output
        os.kill(launch.pid, signal.SIGTERM)
        assert launch.wait(timeout=60) == 75, launch.output
    finally:
        launch.cleanup()
    stopped = load_ckpt(run_dir / "checkpoints/last.pt")
    assert stopped["mid_epoch"] and HELD_STEP <= stopped["step"] < 32 and set(stopped["ema"]) == set(stopped["model"])
    code, resumed = run_launch([*EMA_RUN, f"run_dir={run_dir}", "--resume", "auto"], tmp_path, tag, name="resumed")
    assert code == 0, resumed.output
    a, b = load_ckpt(tmp_path / "straight/checkpoints/last.pt"), load_ckpt(run_dir / "checkpoints/last.pt")
    assert a["step"] == b["step"] == 32
    for part in ("model", "ema"):
        assert all(torch.equal(a[part][k], b[part][k]) for k in a[part]), part
    assert not all(torch.equal(a["model"][k], a["ema"][k]) for k in a["model"])

    logged = [m for m in metrics(tmp_path / "straight") if m["split"] == "val"][-1]
    assert logged["weights"] == "ema" and logged["step"] == 32
    checked = {}
    for weights in ("ema", "model"):  # one process, the run's thread count: exact validation gives its numbers
        r = cli("validate", "straight/checkpoints/last.pt", "--weights", weights, "--json", "trainer.cpu_threads=1",
                cwd=tmp_path)
        assert r.returncode == 0, r.output
        checked[weights] = json.loads(r.stdout)
        assert checked[weights]["checkpoint"]["weights"] == weights
    assert checked["ema"]["metrics"] == {k: logged[k] for k in ("loss", "accuracy")}
    assert checked["model"]["metrics"]["loss"] != checked["ema"]["metrics"]["loss"]
    import mgpucli

    loaded = mgpucli.load_checkpoint(tmp_path / "straight/checkpoints/last.pt", weights="ema")
    assert loaded.info["weights"] == "ema"
    assert all(torch.equal(v, a["ema"][k]) for k, v in loaded.model.state_dict().items())


def test_ema_under_fsdp_round_trips_a_sharded_checkpoint_bitwise(tmp_path):
    args = [*CHARLM_SMALL, "trainer.strategy=fsdp", "trainer.ema.decay=0.9", "trainer.ema.validate=true"]
    whole = [*args, "trainer.checkpoint_format=full"]
    straight = torchrun(2, "train", CHARLM, *whole, "run_dir=straight", cwd=tmp_path)
    assert straight.returncode == 0, straight.output
    half = torchrun(2, "train", CHARLM, *args, "trainer.max_steps=3", "run_dir=split", cwd=tmp_path)  # sharded
    assert half.returncode == 0, half.output
    # the rest from the shards (each rank's share of the average), then saved whole, to compare
    rest = torchrun(2, "train", CHARLM, *whole, "run_dir=split", "--resume", "split/checkpoints/last.dcp",
                    cwd=tmp_path)
    assert rest.returncode == 0, rest.output
    a, b = load_ckpt(tmp_path / "straight/checkpoints/last.pt"), load_ckpt(tmp_path / "split/checkpoints/last.pt")
    assert a["step"] == b["step"] == 6
    for part in ("model", "ema"):
        assert all(torch.equal(a[part][k], b[part][k]) for k in a[part]), part
    vals = [m for m in metrics(tmp_path / "straight") if m["split"] == "val"]
    assert vals and all(m["weights"] == "ema" for m in vals)


# 16 steps per epoch on 2 x 32; accuracy can't improve by 0.5 after the first validation, so the run stops after
# the third epoch of 20. A short collective timeout: a rank left behind would fail the run within seconds.
STOPPING = ["data.train.num_samples=1024", "data.val.num_samples=301", "trainer.epochs=20", "trainer.log_every=8",
            "trainer.cpu_threads=1", "~scheduler", "trainer.timeout_s=30",
            "trainer.early_stopping={metric: accuracy, patience: 2, min_delta: 0.5}"]


def test_early_stopping_stops_every_rank_at_one_step_and_resumes_bitwise(tmp_path):
    r = torchrun(2, "train", QUICK, *STOPPING, "run_dir=straight", cwd=tmp_path, timeout=120)
    assert r.returncode == 0, r.output
    assert "early stopping: val accuracy has not improved by more than 0.5 for 2 validation(s)" in r.stderr
    last = tmp_path / "straight/checkpoints/last.pt"
    ckpt = load_ckpt(last)
    assert ckpt["step"] == 48 and ckpt["epoch"] == 3 and not ckpt["mid_epoch"]
    assert ckpt["early_stopping"]["wait"] == 2 and ckpt["early_stopping"]["best_step"] == 16
    records = metrics(tmp_path / "straight")
    assert [m["step"] for m in records if m["split"] == "val"] == [16, 32, 48]
    stop = records[-1]
    assert stop["split"] == "stop" and stop["reason"] == "early_stopping" and stop["step"] == 48
    assert stop["metric"] == "accuracy" and "has not improved" in stop["message"]

    # stopped after 2 epochs (max_steps), resumed: the patience count carried over, the same step, the same weights
    part = torchrun(2, "train", QUICK, *STOPPING, "trainer.max_steps=32", "run_dir=split", cwd=tmp_path)
    assert part.returncode == 0, part.output
    assert load_ckpt(tmp_path / "split/checkpoints/last.pt")["early_stopping"]["wait"] == 1
    rest = torchrun(2, "train", QUICK, *STOPPING, "run_dir=split", "--resume", "auto", cwd=tmp_path)
    assert rest.returncode == 0, rest.output
    resumed = load_ckpt(tmp_path / "split/checkpoints/last.pt")
    assert resumed["step"] == 48 and all(torch.equal(ckpt["model"][k], resumed["model"][k]) for k in ckpt["model"])

    # a run that had stopped stops again at once, and leaves its checkpoint alone
    before = last.read_bytes()
    again = torchrun(2, "train", QUICK, *STOPPING, "run_dir=straight", "--resume", "auto", cwd=tmp_path)
    assert again.returncode == 0, again.output
    assert "the run stopped at step 48; nothing left to train" in again.stderr
    assert last.read_bytes() == before


def test_profiler_window_traces_the_asked_steps_on_every_rank(tmp_path):
    r = torchrun(2, "train", QUICK, "data.train.num_samples=1024", "data.val.num_samples=101", "trainer.epochs=2",
                 "trainer.log_every=8", "trainer.profile={start_step: 10, steps: 5}", cwd=tmp_path)
    assert r.returncode == 0, r.output
    run_dir = tmp_path / "runs/quickstart"
    assert "profiler: steps 10-14 traced into" in r.stderr
    for rank in (0, 1):
        trace = json.loads((run_dir / f"profile/rank{rank}.json").read_text())  # Chrome trace format
        steps = sorted({int(e["name"].split("#")[1]) for e in trace["traceEvents"]
                        if str(e.get("name", "")).startswith("ProfilerStep#")})
        assert steps == [10, 11, 12, 13, 14], (rank, steps)
        assert any("aten::" in str(e.get("name")) for e in trace["traceEvents"])  # the ops inside them
    assert sorted(p.name for p in (run_dir / "profile").iterdir()) == ["rank0.json", "rank1.json"]
    assert load_ckpt(run_dir / "checkpoints/last.pt")["step"] == 32  # training went on to its end


@pytest.mark.gpu
def test_gpu_run_with_every_feature(tmp_path):
    r = mgpu("train", CHARLM, "+data.train.num_chars=20000", "+data.val.num_chars=8000", "trainer.max_steps=8",
             "trainer.device=cuda", "trainer.precision=bf16", "trainer.activation_checkpointing=true",
             "trainer.ema={decay: 0.9, validate: true}", "trainer.profile={start_step: 3, steps: 2}",
             "trainer.early_stopping={patience: 5}", cwd=tmp_path)
    assert r.returncode == 0, r.output
    trace = json.loads((tmp_path / "runs/charlm/profile/rank0.json").read_text())
    assert any(e.get("cat") == "kernel" for e in trace["traceEvents"])  # CUDA activity, not only the CPU's
    ckpt = load_ckpt(tmp_path / "runs/charlm/checkpoints/last.pt")
    assert all(t.device.type == "cpu" for t in ckpt["ema"].values())
    v = mgpu("validate", "runs/charlm/checkpoints/last.pt", "--weights", "ema", "--gpus", "1", "--json", cwd=tmp_path)
    assert v.returncode == 0, v.output
    assert json.loads(v.stdout)["checkpoint"]["weights"] == "ema"
