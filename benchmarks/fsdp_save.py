#!/usr/bin/env python
"""What a checkpoint costs under ``fsdp``: each rank's peak host memory and how long the save holds training, for
``trainer.checkpoint_format=full`` (rank 0 gathers the whole model and optimizer state and writes one file),
``sharded`` (the default under fsdp: every rank writes its own shards) and ``sharded`` with ``trainer.async_save``
(the shards written in the background while training goes on).

Three runs of the char LM recipe with a large, shallow-batch model (``torchrun`` + ``mgpu train``, CPU, gloo), a few
steps and one save at the end. Each rank's peak is its worker's ``VmHWM`` read from outside (benchmarks/jobs.py);
the save's times are rank 0's own lines (``checkpoint at step N written in X s``; with async, ``training goes on
after X s`` and ``complete, Y s after it began``).

    python benchmarks/fsdp_save.py                          # ~201M parameters, 2 processes: ~3 min on 2 cores
    python benchmarks/fsdp_save.py --d-model 512 --layers 4 # a smoke run, seconds
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from benchmarks import jobs  # noqa: E402

SIDES = {"full": ["trainer.checkpoint_format=full"], "sharded": [],
         "async": ["trainer.async_save=true"]}  # sharded is fsdp's default (trainer.checkpoint_format=auto)
_HELD_ASYNC = re.compile(r"checkpoint at step \d+: training goes on after ([\d.]+) s")
_WRITTEN = re.compile(r"checkpoint at step \d+ written in ([\d.]+) s")
_COMPLETE = re.compile(r"checkpoint at step \d+ complete, ([\d.]+) s after it began")


def save_times(log: str) -> tuple[float | None, float | None]:
    """(seconds the last save held training, seconds until it was complete) from rank 0's lines."""
    held = [float(s) for s in _HELD_ASYNC.findall(log)] or [float(s) for s in _WRITTEN.findall(log)]
    complete = [float(s) for s in _COMPLETE.findall(log)] or [float(s) for s in _WRITTEN.findall(log)]
    return (held[-1] if held else None), (complete[-1] if complete else None)


def run_side(args, side: str, root: Path) -> tuple[dict[int, float], float | None, float | None]:
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={args.nproc}",
           "-m", "mgpucli", "train", str(REPO / "recipes" / "charlm.yaml"), f"run_dir={root / side}",
           "trainer.strategy=fsdp", f"model.d_model={args.d_model}", f"model.n_layer={args.layers}",
           f"model.n_head={args.heads}", "vars.block_size=16", "data.batch_size=1", "data.val=null",
           "trainer.best_metric=null", "+data.train.num_chars=4000", f"trainer.max_steps={args.steps}",
           "trainer.log_every=1", "trainer.cpu_threads=1", *SIDES[side]]
    log = root / f"{side}.log"
    done = jobs.run(cmd, {**os.environ, "OMP_NUM_THREADS": "1"}, args.timeout, log, cwd=REPO)
    text = log.read_text(errors="replace")
    if done.rc != 0:
        sys.exit(f"fsdp_save.py: the {side} run " + ("timed out" if done.rc is None else
                                                      f"exited {done.rc}:\n{text[-3000:]}"))
    shutil.rmtree(root / side, ignore_errors=True)  # the next run's disk
    return done.peak_rss_mib, *save_times(text)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--nproc", type=int, default=2)
    ap.add_argument("--d-model", type=int, default=1024)
    ap.add_argument("--layers", type=int, default=16)
    ap.add_argument("--heads", type=int, default=8)
    ap.add_argument("--steps", type=int, default=2, help="optimizer steps before the one save (default 2)")
    ap.add_argument("--timeout", type=float, default=300, help="seconds one run may take (default 300)")
    args = ap.parse_args(argv)
    params = 12 * args.d_model**2 * args.layers + args.d_model * (2 * 96 + 16 + 13)  # blocks, embeddings, norms
    root = Path(tempfile.mkdtemp(prefix="mgpu-fsdp-save-"))
    try:
        results = {side: run_side(args, side, root) for side in SIDES}
    finally:
        shutil.rmtree(root, ignore_errors=True)
    print(f"CharTransformer d_model={args.d_model} layers={args.layers} (~{params / 1e6:.0f}M parameters), AdamW, "
          f"{args.nproc} CPU processes (gloo), {args.steps} steps then one save\n")
    print("| trainer.checkpoint_format | rank | peak RSS | save holds training | save complete |")
    print("|---|---|---|---|---|")
    for side, (peaks, held, complete) in results.items():
        name = {"full": "full", "sharded": "sharded (fsdp's default)", "async": "sharded + async_save"}[side]
        for rank, mib in peaks.items():
            times = f"{held:.2f} s | {complete:.2f} s" if rank == 0 and held is not None else " | "
            print(f"| {name} | {rank} | {mib:.0f} MiB | {times} |")
    base = results["sharded"][0].get(0)
    for side in ("full", "async"):
        peak = results[side][0].get(0)
        if base and peak:
            print(f"\nrank 0's peak, {side} / sharded: {peak / base:.2f}", end="")
    print()
    return 0


if __name__ == "__main__":
    jobs.run_main(main)
