"""The fit probe's pure parts: where an OOM happened, the knobs it suggests, and the report's lines."""

from __future__ import annotations

import pytest
import torch

from mgpucli.cli.probe_report import add_scaling, duration, lines, size
from mgpucli.config import load_recipe
from mgpucli.engine.probe import knobs, out_of_memory, phase_of


@pytest.mark.parametrize("heartbeat, stepping, expected", [
    ("setup: DDP parameter broadcast", False, "setup"), ("forward", True, "forward"),
    ("backward (gradient all-reduce)", True, "backward"), ("optimizer step", True, "optimizer step"),
])
def test_the_phase_of_an_out_of_memory_error(heartbeat, stepping, expected):
    assert phase_of(heartbeat, stepping) == expected


def test_knobs_come_in_order_and_skip_what_the_recipe_already_does():
    plain = knobs(load_recipe("charlm"))
    assert [k.split(" ")[0] for k in plain] == ["data.batch_size=8", "trainer.precision=bf16",
                                                 "trainer.activation_checkpointing=true", "trainer.strategy=fsdp"]
    assert "trainer.grad_accum=2" in plain[0]
    tuned = knobs(load_recipe("charlm", ["data.batch_size=1", "trainer.precision=bf16",
                                         "trainer.activation_checkpointing=true", "trainer.strategy=fsdp"]))
    assert tuned == ["trainer.fsdp.cpu_offload=true (keep parameters and optimizer state in CPU memory)"]


def test_the_out_of_memory_message_names_rank_phase_step_and_the_knobs():
    err = torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of ...")
    failed = out_of_memory(err, "backward", step=5, warmup=3, cfg=load_recipe("charlm"), rank=1,
                           device=torch.device("cpu"))
    assert failed.exit_code == 1 and failed.retryable is False
    assert failed.message.startswith("rank 1: it does not fit: out of GPU memory in the backward of measured step 2 "
                                     "(tried to allocate 2.00 gib)")
    assert failed.hint.splitlines()[1].startswith("  1. data.batch_size=8 trainer.grad_accum=2")
    assert "during setup" in out_of_memory(err, "setup", 1, 3, load_recipe("charlm"), 0, torch.device("cpu")).message


def test_report_lines():
    rank = {"rank": 0, "host": "h", "device": "cuda:0", "step_time_s": 0.05, "samples_per_s": 640.0,
            "peak_rss_bytes": 3 * 2**30, "host_total_bytes": 64 * 2**30,
            "cuda": {"max_allocated_bytes": 30 * 2**30, "max_reserved_bytes": 40 * 2**30, "total_bytes": 80 * 2**30}}
    report = {"recipe": "r", "world_size": 1, "device": "cuda:0", "strategy": "single", "precision": "bf16",
              "global_batch": 32, "batch_size": 32, "grad_accum": 1, "warmup_steps": 3, "measured_steps": 20,
              "step_time_s": 0.05, "samples_per_s": 640.0, "steps_per_epoch": 100, "epoch_time_s": 5.0,
              "total_steps": 300, "run_time_s": 15.0, "fits": True, "ranks": [rank],
              "hosts": {"h": {"ranks": 1, "peak_rss_sum_bytes": 3 * 2**30, "total_bytes": 64 * 2**30}}}
    text = "\n".join(lines(report))
    assert "GPU 30.0 GiB allocated, 40.0 GiB reserved of 80.0 GiB (50%); host RSS 3.0 GiB" in text
    assert "an epoch (100 steps) ~ 5.0 s, the run (300 steps) ~ 15.0 s" in text and "it fits" in text
    assert (size(512), size(3 * 2**20), duration(0.0123), duration(600)) == ("512 B", "3.0 MiB", "12.3 ms", "10.0 min")


def test_scaling_efficiency_and_where_the_extra_time_went():
    def anatomy(step_s, comm):
        return {"step_s": step_s, "data": 0.1, "compute": 0.8 - comm, "comm": comm, "optimizer": 0.1, "other": 0.0}

    def report(world, step_s, comm):
        ranks = [{"rank": r, "host": "h", "device": "cpu", "step_time_s": step_s, "samples_per_s": 32 / step_s,
                  "peak_rss_bytes": 2**28, "host_total_bytes": 2**34, "cuda": None, "anatomy": anatomy(step_s, comm)}
                 for r in range(world)]
        return {"recipe": "r", "world_size": world, "device": "cpu", "strategy": "ddp", "precision": "fp32",
                "global_batch": 32 * world, "batch_size": 32, "grad_accum": 1, "warmup_steps": 3,
                "measured_steps": 20, "step_time_s": step_s, "samples_per_s": 32 * world / step_s,
                "steps_per_epoch": 10, "epoch_time_s": 10 * step_s, "total_steps": 30, "run_time_s": 30 * step_s,
                "fits": True, "ranks": ranks, "hosts": {}}

    two = report(2, 0.02, 0.5)
    add_scaling(two, report(1, 0.01, 0.0))
    scaling = two["scaling"]
    assert scaling["speedup"] == pytest.approx(1.0) and scaling["efficiency"] == pytest.approx(0.5)
    assert scaling["added_s_per_step"]["comm"] == pytest.approx(0.01)  # all of the extra 10 ms is comm
    text = "\n".join(lines(two))
    assert "scaling: the same 20 timed steps on 1 process and on 2" in text
    assert "1.00x         50%" in text and "comm +10.0 ms" in text
