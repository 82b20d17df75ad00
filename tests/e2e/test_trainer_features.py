"""The trainer's optional features for real: activation checkpointing, EMA, early stopping, the profiler window.

Real ``mgpu train`` processes (alone or under torchrun, gloo on CPU), real files under tmp_path.
"""

from __future__ import annotations

import json

import torch

from tests.procs import RECIPES, load_ckpt, torchrun

CHARLM = str(RECIPES / "charlm.yaml")
# charlm small enough for seconds per run on 2 cores; dropout makes the RNG matter; 1 thread per rank on both sides
CHARLM_SMALL = ["+data.train.num_chars=20000", "+data.val.num_chars=8000", "trainer.max_steps=12",
                "trainer.log_every=2", "+model.dropout=0.1", "trainer.cpu_threads=1"]


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
