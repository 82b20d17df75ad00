#!/usr/bin/env python
"""mgpu's step path against the hand-written loop's, in one process: the part of the overhead mgpu's own code adds.

On a shared 2-core machine the wall time of 2-process DDP steps varies by tens of percent from run to run, far
more than the few microseconds a step's bookkeeping costs. Here both loops run in one process, on one model and
the same pre-loaded batches, alternating chunks of 20 steps (AB, BA, ...), and each chunk's CPU time is taken:

* (A) the hand-written loop's body (benchmarks/handwritten.py): ``x, y = x.to(device), y.to(device); loss =
  F.cross_entropy(model(x), y); zero_grad; backward; (clip;) step; (scheduler.step)``;
* (B) mgpu's ``Trainer._forward_backward`` + ``Trainer._optimizer_step`` (metric pieces, NaN bookkeeping, progress
  attributes, and, every ``log_every`` steps, the reduction, metrics.jsonl, TensorBoard).

No DDP and no data loading on either side: this isolates what mgpu's code adds per step. Run with
``--log-every 0`` to leave out the log interval (per-step cost only). Prints one JSON object.

    python benchmarks/inprocess.py --workload mlp --rounds 40
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from dataclasses import asdict
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

RECIPES = {"mlp": REPO / "recipes" / "quickstart.yaml", "charlm": REPO / "recipes" / "charlm.yaml"}
CHUNK = 20


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--workload", choices=sorted(RECIPES), default="mlp")
    p.add_argument("--rounds", type=int, default=40, help="A/B chunk pairs (default 40)")
    p.add_argument("--log-every", type=int, default=None, help="trainer.log_every (default: the recipe's; 0: never)")
    args = p.parse_args(argv)

    import torch
    import torch.nn.functional as F

    from benchmarks.stats import median, paired_ratios, spread
    from mgpucli.config import load_recipe
    from mgpucli.dist import runtime
    from mgpucli.dist.env import RankEnv
    from mgpucli.engine.report import NullReporter
    from mgpucli.engine.trainer import Trainer

    torch.set_num_threads(1)
    overrides = [f"run_dir={tempfile.mkdtemp(prefix='mgpu-inprocess-')}/run", "trainer.device=cpu"]
    if args.log_every is not None:
        overrides.append(f"trainer.log_every={args.log_every or 10**9}")
    cfg = load_recipe(str(RECIPES[args.workload]), overrides)
    trainer = Trainer(cfg, runtime.setup(RankEnv(), "cpu", 60, 1), NullReporter())
    trainer.setup()
    trainer.wrapped.train.train()
    trainer._interval_start, trainer._interval_steps = time.perf_counter(), 0
    model, optimizer, scheduler = trainer.wrapped.raw, trainer.optimizer, trainer.scheduler
    clip = trainer.hot.clip_grad_norm
    batches = list(trainer.loaders.train)

    def loss_fn(out, y):  # as benchmarks/handwritten.py writes it for this workload
        if args.workload == "mlp":
            return F.cross_entropy(out, y)
        return F.cross_entropy(out.view(-1, out.size(-1)), y.view(-1))

    device = trainer.rt.device

    def hand(batch) -> None:
        x, y = batch
        x, y = x.to(device), y.to(device)
        loss = loss_fn(model(x), y)
        optimizer.zero_grad()
        loss.backward()
        if clip is not None:
            torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
        optimizer.step()
        if scheduler is not None:
            scheduler.step()

    def mgpu(batch) -> None:
        trainer._forward_backward(batch, sync=True)
        trainer._optimizer_step()

    per_step: dict[str, list[float]] = {"A": [], "B": []}
    sides = {"A": hand, "B": mgpu}
    for rnd in range(args.rounds + 2):  # the first two pairs warm up
        for side in ("A", "B") if rnd % 2 == 0 else ("B", "A"):
            t0 = time.process_time()
            for i in range(CHUNK):
                sides[side](batches[(rnd * CHUNK + i) % len(batches)])
            if rnd >= 2:
                per_step[side].append((time.process_time() - t0) / CHUNK)
    trainer.close()
    ratios = paired_ratios(per_step["B"], per_step["A"])
    print(json.dumps({
        "workload": args.workload, "log_every": trainer.hot.log_every, "rounds": args.rounds, "chunk": CHUNK,
        "A_us": 1e6 * median(per_step["A"]), "B_us": 1e6 * median(per_step["B"]),
        "diff_us": asdict(spread([1e6 * (b - a) for a, b in zip(per_step["A"], per_step["B"], strict=True)])),
        "ratio": asdict(spread(ratios)),
    }))


if __name__ == "__main__":
    main()
