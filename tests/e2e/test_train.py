"""End-to-end: the real `mgpu train` CLI in subprocesses, real torch.distributed (gloo) on CPU, real files."""

from __future__ import annotations

import json
import shutil
import sys

import pytest
import torch

from tests.inproc import cli
from tests.procs import RECIPES, free_port, load_ckpt, mgpu, run, torchrun

QUICK = str(RECIPES / "quickstart.yaml")
# A smaller quickstart so each run takes a few seconds on 2 cores.
SMALL = ["data.train.num_samples=1024", "data.val.num_samples=301", "trainer.log_every=8"]


def metrics(run_dir) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


@pytest.mark.parametrize("never", ["trainer.val_every=0", "data.val=null"])
def test_a_best_metric_without_validation_is_said_not_silent(tmp_path, never):
    r = cli("train", QUICK, *SMALL, "trainer.max_steps=4", never, cwd=tmp_path)
    assert r.returncode == 0, r.output
    assert "warning: trainer.best_metric=accuracy picks best.pt by validation, but" in r.stderr
    assert "this run writes no best.pt (set trainer.best_metric=null to say so)" in r.stderr
    assert not (tmp_path / "runs/quickstart/checkpoints/best.pt").exists()
    quiet = cli("train", QUICK, *SMALL, "trainer.max_steps=4", never, "trainer.best_metric=null", "run_dir=b",
                cwd=tmp_path)
    assert quiet.returncode == 0 and "warning" not in quiet.stderr, quiet.output


def test_quickstart_one_process_writes_a_clean_run_dir(tmp_path):
    r = mgpu("train", QUICK, *SMALL, "trainer.epochs=2", cwd=tmp_path)
    assert r.returncode == 0, r.output
    run_dir = tmp_path / "runs" / "quickstart"
    assert (run_dir / "recipe.yaml").read_text().startswith("name: quickstart")
    ckpt = load_ckpt(run_dir / "checkpoints" / "last.pt")  # weights_only=True
    assert ckpt["step"] == 64 and ckpt["epoch"] == 2 and ckpt["world_size"] == 1
    assert not any(k.startswith(("module.", "_orig_mod.")) for k in ckpt["model"])
    assert set(ckpt["optimizer"]["state"]) == set(ckpt["model"])  # keyed by parameter name
    assert (run_dir / "checkpoints" / "best.pt").exists()
    vals = [m for m in metrics(run_dir) if m["split"] == "val"]
    assert len(vals) == 2 and vals[-1]["samples"] == 301 and vals[-1]["accuracy"] > 0.8  # chance is 0.25
    trains = [m for m in metrics(run_dir) if m["split"] == "train"]
    assert all({"step", "epoch", "loss", "accuracy", "samples_per_s"} <= set(m) for m in trains)
    assert "global batch 32 = 32 per process x 1 process(es) x 1" in r.stderr
    assert r.stdout == ""  # human output goes to stderr
    assert len(list((run_dir / "tensorboard").glob("events.out.tfevents.*"))) == 1  # written without tensorboard
    try:
        from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    except ImportError:  # the viewer is the `tensorboard` extra (requirements.txt installs it)
        return
    events = EventAccumulator(str(run_dir / "tensorboard"))
    events.Reload()
    assert [(e.step, round(e.value, 5)) for e in events.Scalars("train/loss")] == \
        [(m["step"], round(m["loss"], 5)) for m in trains]
    assert [e.step for e in events.Scalars("val/accuracy")] == [m["step"] for m in vals]


# One epoch of the small quickstart on 2 processes at 16 each (global batch 32, 32 steps), 1 thread: what the
# 1-process run, the accumulating run and the resume on another world size are compared with.
TWO = [*SMALL, "trainer.epochs=1", "trainer.cpu_threads=1", "data.batch_size=16"]


@pytest.fixture(scope="module")
def two(tmp_path_factory):
    """The finished 2-process run of ``TWO`` (its run dir, its Result), shared by the module's tests."""
    folder = tmp_path_factory.mktemp("two")
    r = torchrun(2, "train", QUICK, *TWO, "run_dir=two", cwd=folder)
    assert r.returncode == 0, r.output
    return folder / "two", r


def test_two_processes_match_one_process_with_twice_the_batch(tmp_path, two):
    run_two, r_two = two
    one = cli("train", QUICK, *SMALL, "trainer.epochs=1", "trainer.cpu_threads=1", "data.batch_size=32",
              "run_dir=one", cwd=tmp_path)
    assert one.returncode == 0, one.output
    a, b = load_ckpt(run_two / "checkpoints/last.pt"), load_ckpt(tmp_path / "one/checkpoints/last.pt")
    assert a["world_size"] == 2 and b["world_size"] == 1 and a["step"] == b["step"] == 32
    for key in b["model"]:
        torch.testing.assert_close(a["model"][key], b["model"][key], rtol=1e-4, atol=1e-5)
    assert "global batch 32 = 16 per process x 2 process(es)" in r_two.stderr
    assert r_two.stderr.count("global batch") == 1  # only rank 0 prints
    # every log interval has its record, once and in order, however many shared an all-reduce (ms steps: several)
    trains = {"one": [m for m in metrics(tmp_path / "one") if m["split"] == "train"],
              "two": [m for m in metrics(run_two) if m["split"] == "train"]}
    assert [m["step"] for m in trains["two"]] == [m["step"] for m in trains["one"]] == [8, 16, 24, 32]
    for a, b in zip(trains["two"], trains["one"], strict=True):
        assert a["loss"] == pytest.approx(b["loss"], rel=1e-4)
        assert a["accuracy"] == pytest.approx(b["accuracy"], abs=0.01)


def test_legacy_torch_distributed_launch(tmp_path):
    r = run([sys.executable, "-m", "torch.distributed.launch", "--nproc-per-node", "2",
             "--master-port", str(free_port()),
             "-m", "mgpucli", "train", QUICK, *SMALL, "trainer.epochs=1"], cwd=tmp_path, timeout=180)
    assert r.returncode == 0, r.output
    assert load_ckpt(tmp_path / "runs/quickstart/checkpoints/last.pt")["world_size"] == 2


def test_resume_mid_epoch_equals_uninterrupted_bitwise(tmp_path):
    # Dropout makes the RNG state matter: the resumed run must restore it exactly, per rank. One fixed T_max:
    # ${total_steps:} would give the max_steps=21 run a schedule of its own, which its checkpoint carries on.
    common = [*SMALL, "trainer.epochs=2", "+model.dropout=0.1", "trainer.cpu_threads=1", "scheduler.T_max=32"]
    full = torchrun(2, "train", QUICK, *common, "run_dir=full", cwd=tmp_path)
    assert full.returncode == 0, full.output
    part = torchrun(2, "train", QUICK, *common, "trainer.max_steps=21", "run_dir=part", cwd=tmp_path)
    assert part.returncode == 0, part.output
    mid = load_ckpt(tmp_path / "part/checkpoints/last.pt")
    assert mid["step"] == 21 and mid["mid_epoch"] and mid["epoch"] == 1  # 16 steps per epoch
    resumed = torchrun(2, "train", QUICK, *common, "run_dir=part", "--resume", "auto", cwd=tmp_path)
    assert resumed.returncode == 0, resumed.output
    assert "resumed from" in resumed.stderr and "trainer.max_steps" in resumed.stderr  # changed-key warning
    a, b = load_ckpt(tmp_path / "full/checkpoints/last.pt"), load_ckpt(tmp_path / "part/checkpoints/last.pt")
    assert a["step"] == b["step"] == 32
    for key in a["model"]:
        assert torch.equal(a["model"][key], b["model"][key]), key
    for key, value in a["optimizer"]["state"].items():
        assert torch.equal(value["momentum_buffer"], b["optimizer"]["state"][key]["momentum_buffer"])


def test_same_recipe_and_seed_gives_the_same_weights(tmp_path):
    args = [*SMALL, "trainer.max_steps=12"]
    assert mgpu("train", QUICK, *args, "run_dir=a", cwd=tmp_path).returncode == 0
    # the second in this process: the same weights however the run was started
    assert cli("train", QUICK, *args, "run_dir=b", "trainer.tensorboard=false", cwd=tmp_path).returncode == 0
    a, b = load_ckpt(tmp_path / "a/checkpoints/last.pt"), load_ckpt(tmp_path / "b/checkpoints/last.pt")
    assert all(torch.equal(a["model"][k], b["model"][k]) for k in a["model"])
    steps = [m["step"] for m in metrics(tmp_path / "b")]
    assert steps and steps == [m["step"] for m in metrics(tmp_path / "a")]
    assert not (tmp_path / "b/tensorboard").exists()  # trainer.tensorboard=false: metrics.jsonl only
    assert list((tmp_path / "a/tensorboard").glob("events.out.tfevents.*"))


def test_resume_with_another_world_size_at_an_epoch_end_keeps_the_global_batch(tmp_path, two):
    shutil.copytree(two[0], tmp_path / "two")  # the 2-process run, ended at its epoch's end; resumed on 1 process
    r = cli("train", QUICK, *SMALL, "trainer.epochs=2", "trainer.cpu_threads=1", "run_dir=two", "--resume", "auto",
            cwd=tmp_path)  # the batch size left to the resume: it keeps the global batch
    assert r.returncode == 0, r.output
    assert "keeping the checkpoint's global batch 32" in r.stderr and "goes on after" not in r.stderr
    ckpt = load_ckpt(tmp_path / "two/checkpoints/last.pt")
    assert ckpt["world_size"] == 1 and ckpt["step"] == 64  # 32 steps of 32 samples per epoch on 2 and on 1


def test_resume_with_plain_sgd_keeps_the_schedule(tmp_path):
    """SGD without momentum has no per-parameter state; resuming it used to crash inside dcp's loader."""
    args = [*SMALL, "optim.momentum=0", "scheduler.T_max=64"]  # one schedule for the 10- and the 20-step runs
    first = cli("train", QUICK, *args, "trainer.max_steps=10", cwd=tmp_path)
    assert first.returncode == 0, first.output
    r = cli("train", QUICK, *args, "trainer.max_steps=20", "--resume", "auto", cwd=tmp_path)
    assert r.returncode == 0 and "Traceback" not in r.stderr, r.output
    straight = cli("train", QUICK, *args, "trainer.max_steps=20", "run_dir=straight", cwd=tmp_path)
    assert straight.returncode == 0, straight.output
    resumed = load_ckpt(tmp_path / "runs/quickstart/checkpoints/last.pt")
    expected = load_ckpt(tmp_path / "straight/checkpoints/last.pt")
    assert resumed["optimizer"]["state"] == {} and resumed["step"] == 20
    # the schedule carried on (the lr is 20 steps in, not 10) and training is the uninterrupted run's
    assert resumed["optimizer"]["param_groups"] == expected["optimizer"]["param_groups"]
    assert all(torch.equal(resumed["model"][k], expected["model"][k]) for k in expected["model"])


def test_nan_single_process_exit_code_1_without_traceback(tmp_path):
    r = mgpu("train", QUICK, *SMALL, cwd=tmp_path, env={"MGPU_FAULT": "nan@step=5"})
    assert r.returncode == 1, r.output
    assert "NaN or inf at step 5" in r.stderr and "Traceback" not in r.stderr


def test_existing_checkpoints_are_not_clobbered(tmp_path):
    assert cli("train", QUICK, *SMALL, "trainer.max_steps=5", cwd=tmp_path).returncode == 0
    last = tmp_path / "runs/quickstart/checkpoints/last.pt"
    before = last.read_bytes()
    r = cli("train", QUICK, *SMALL, "trainer.max_steps=5", cwd=tmp_path)
    assert r.returncode == 2 and "already holds checkpoints" in r.stderr and "--resume auto" in r.stderr
    assert "Traceback" not in r.stderr and last.read_bytes() == before
    r = cli("train", QUICK, *SMALL, "trainer.max_steps=3", "--overwrite", cwd=tmp_path)
    assert r.returncode == 0, r.output
    assert load_ckpt(last)["step"] == 3


@pytest.mark.parametrize("recipe", ["digits"])
def test_digits_reaches_95_percent_on_two_processes(tmp_path, recipe):
    pytest.importorskip("sklearn")
    r = torchrun(2, "train", str(RECIPES / f"{recipe}.yaml"), cwd=tmp_path)
    assert r.returncode == 0, r.output
    vals = [m for m in metrics(tmp_path / "runs" / recipe) if m["split"] == "val"]
    assert vals[-1]["samples"] == 359 and max(v["accuracy"] for v in vals) >= 0.95


def test_charlm_reports_loss_and_perplexity(tmp_path):
    r = cli("train", str(RECIPES / "charlm.yaml"), "trainer.max_steps=12", "trainer.log_every=4",
            "+data.train.num_chars=20000", "+data.val.num_chars=20000", cwd=tmp_path)
    assert r.returncode == 0, r.output
    val = [m for m in metrics(tmp_path / "runs/charlm") if m["split"] == "val"][-1]
    assert val["perplexity"] == pytest.approx(2.718281828 ** val["loss"], rel=1e-9)
    assert 1.0 < val["perplexity"] < 96  # better than uniform over the vocabulary


def test_grad_accum_matches_the_larger_batch_on_two_processes(tmp_path, two):
    accum = torchrun(2, "train", QUICK, *TWO, "data.batch_size=8", "trainer.grad_accum=2", "run_dir=accum",
                     cwd=tmp_path)
    assert accum.returncode == 0, accum.output
    a, b = load_ckpt(tmp_path / "accum/checkpoints/last.pt"), load_ckpt(two[0] / "checkpoints/last.pt")
    assert a["step"] == b["step"] == 32
    for key in a["model"]:
        torch.testing.assert_close(a["model"][key], b["model"][key], rtol=1e-4, atol=1e-5)
    assert "global batch 32 = 8 per process x 2 process(es) x 2 accumulation step(s)" in accum.stderr


def test_loader_workers_bf16_and_per_epoch_scheduler(tmp_path):
    r = mgpu("train", QUICK, *SMALL, "trainer.epochs=2", "data.num_workers=1", "trainer.precision=bf16",
             "trainer.scheduler_interval=epoch", "scheduler.T_max=2", "trainer.keep_checkpoints=1", cwd=tmp_path)
    assert r.returncode == 0, r.output
    ckpts = tmp_path / "runs/quickstart/checkpoints"
    assert sorted(p.name for p in ckpts.iterdir()) == ["best.pt", "last.pt", "step-00000064.pt"]
    ckpt = load_ckpt(ckpts / "last.pt")
    assert ckpt["scheduler"]["last_epoch"] == 2  # stepped once per epoch
    assert metrics(tmp_path / "runs/quickstart")[-1]["accuracy"] > 0.5
