"""benchmarks/overhead.py's logic without jobs: the commands both sides run, step times read from metrics.jsonl,
the per-round ratios, intervals and verdicts, the table, the bitwise weight check and the recipes' constants."""

from __future__ import annotations

from pathlib import Path

import pytest

from benchmarks.overhead import (
    Job,
    command,
    first_step_s,
    parse_args,
    recipe_drift,
    same_weights,
    step_time,
    summarise,
    table,
)


def test_both_sides_run_the_same_workload_processes_and_epochs():
    args = parse_args(["--nproc", "2"])
    a, b = command("A", "mlp", args, Path("/o")), command("B", "mlp", args, Path("/o"))
    assert a[1:4] == ["--standalone", "--nproc-per-node", "2"] and a[4].endswith("benchmarks/handwritten.py")
    assert a[-8:] == ["--workload", "mlp", "--epochs", "10", "--device", "cpu", "--out", "/o"]
    assert b[1:5] == ["launch", "--cpu", "--nproc", "2"] and b[5].endswith("recipes/quickstart.yaml")
    assert b[-2:] == ["run_dir=/o/run", "trainer.epochs=10"]
    assert command("B", "charlm", parse_args(["--epochs", "3"]), Path("/o"))[-1] == "trainer.epochs=3"


def test_gpus_run_one_process_per_gpu_on_both_sides():
    args = parse_args(["--gpus", "4"])
    a, b = command("A", "charlm", args, Path("/o")), command("B", "charlm", args, Path("/o"))
    assert a[3] == "4" and a[a.index("--device") + 1] == "cuda"
    assert b[1:4] == ["launch", "--gpus", "4"]


def _train(step: int, epoch: int, t: float) -> dict:
    return {"split": "train", "step": step, "epoch": epoch, "loss": 1.0, "time": t}


def test_step_time_counts_the_steps_between_records_of_one_epoch():
    # epoch 1: steps 20, 40, 50 (its end); epoch 2: 70, 90 after a 10 s validation and checkpoint
    records = [_train(20, 1, 100.0), _train(40, 1, 102.0), _train(50, 1, 103.5),
               {"split": "val", "step": 50, "epoch": 1, "loss": 1.0, "time": 108.0},
               _train(70, 2, 113.5), _train(90, 2, 115.5)]
    assert step_time(records) == (50, pytest.approx(5.5))  # 20 + 10 + 20 steps; the first 20 and 50->70 left out
    assert first_step_s(records, t0=90.0, step_s=0.11) == pytest.approx(100.0 - 90.0 - 19 * 0.11)
    assert step_time(records[:1]) == (0, 0.0)


def _job(side: str, step_ms: float, first: float = 4.0, rss: float = 300.0, error: str | None = None,
         seconds: float = 10.0) -> Job:
    return Job(side, 0, seconds, step_s=step_ms / 1e3, steps=400, first_step_s=first, rss_mib={0: rss, 1: rss - 5},
               error=error)


def test_rounds_give_paired_ratios_with_an_interval_and_verdicts():
    ratios = [1.00, 1.01, 1.02, 1.01, 1.00, 1.02, 1.01, 0.99]
    rounds = [{"A": _job("A", 2.0), "B": _job("B", 2.0 * r, first=4.2, rss=309.0, seconds=10.4)} for r in ratios]
    s = summarise(rounds, [True] * 8, target=1.03)
    assert s["step_ratio"] == pytest.approx(ratios) and s["step_verdict"] == "ok"
    assert s["first_step_diff_s"] == pytest.approx([0.2] * 8) and s["first_step_verdict"] == "ok"
    assert s["rss_ratio"] == pytest.approx([1.03] * 8) and s["rss_verdict"] == "ok"
    assert s["B"]["rss_mib"] == {0: 309.0, 1: 304.0} and s["A"]["step_ms"] == pytest.approx(2.0)
    assert s["weights_verdict"] == "ok" and s["errors"] == []
    text = "\n".join(table("mlp", s, 10))
    assert "| step time | 2.000 ms | 2.020 ms | 1.010 (0.990 to 1.020) | <= 1.03 | ok |" in text
    assert "| peak RSS per rank (MiB, rank 0 / 1 / ...) | 300 / 295 | 309 / 304 | 1.030 (1.030 to 1.030)" in text
    assert "| final weights bitwise equal | | | 8 of 8 rounds | all | ok |" in text
    assert "| whole job | 10.00 s | 10.40 s | +0.40 (+0.40 to +0.40) s | <= +0.5 s | ok |" in text

    slow = summarise([{"A": _job("A", 2.0), "B": _job("B", 2.2 * r)} for r in ratios], [True] * 8, target=1.03)
    assert slow["step_verdict"] == "MISSED"
    wide = [0.95, 1.10, 1.00, 1.06, 0.97, 1.08, 1.01, 1.05]
    s = summarise([{"A": _job("A", 2.0), "B": _job("B", 2.0 * r)} for r in wide], [True] * 8, target=1.03)
    assert s["step_verdict"] == "not resolved"


def test_few_rounds_a_failed_job_and_different_weights_are_reported():
    rounds = [{"A": _job("A", 2.0), "B": _job("B", 2.1)}, {"A": _job("A", 2.0), "B": _job("B", 9.9, error="exit 1")}]
    s = summarise(rounds, [False], target=1.03)
    assert s["complete"] == 1 and s["step_ratio"] == pytest.approx([1.05])
    assert s["step_verdict"] == "too few rounds" and s["weights_verdict"] == "MISSED"
    assert s["errors"] == ["round 2 mgpu: exit 1"]
    text = "\n".join(table("charlm", s, 1))
    assert "1.050 (1 rounds: no interval)" in text and "round 2 mgpu: exit 1" in text


def test_weights_must_be_equal_to_the_bit(tmp_path):
    import torch

    w = {"a": torch.tensor([1.0, 0.0]), "b": torch.ones(2, 2)}
    torch.save(w, tmp_path / "hand.pt")
    torch.save({"model": w, "step": 3}, tmp_path / "mgpu.pt")
    torch.save({"model": {"a": torch.tensor([1.0, -0.0]), "b": w["b"]}}, tmp_path / "signed_zero.pt")
    assert same_weights(str(tmp_path / "hand.pt"), str(tmp_path / "mgpu.pt"))
    assert not same_weights(str(tmp_path / "hand.pt"), str(tmp_path / "signed_zero.pt"))  # torch.equal would say equal
    assert not same_weights(str(tmp_path / "hand.pt"), None)


def test_the_hand_written_loop_trains_what_the_shipped_recipes_say():
    assert recipe_drift("mlp") == [] and recipe_drift("charlm") == []
