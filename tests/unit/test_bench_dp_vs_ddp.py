"""benchmarks/dp_vs_ddp.py's pure parts (the runs themselves need GPUs)."""

from __future__ import annotations

from pathlib import Path

from benchmarks.dp_vs_ddp import efficiency, overrides, parse_args, throughput


def test_throughput_is_the_median_after_the_warm_up_intervals():
    records = [{"split": "train", "samples_per_s": v} for v in (10.0, 50.0, 100.0, 300.0, 200.0)]
    records.insert(2, {"split": "val", "samples": 5})
    assert throughput(records) == 200.0  # 100, 300, 200 after skipping 10 and 50
    assert throughput(records[:2]) is None


def test_efficiency_per_gpu():
    assert efficiency(360.0, 4, 100.0) == 0.9
    assert efficiency(None, 4, 100.0) is None and efficiency(360.0, 4, None) is None


def test_dp_splits_one_global_batch_ddp_gets_the_per_gpu_batch():
    args = parse_args(["--batch-size", "16"])
    dp, ddp = overrides(args, "dp", 4, Path("r")), overrides(args, "ddp", 4, Path("r"))
    assert "data.batch_size=64" in dp and "trainer.strategy=dp" in dp
    assert "data.batch_size=16" in ddp and "trainer.strategy=ddp" in ddp
    assert "trainer.val_every=0" in ddp and "run_dir=r" in ddp
