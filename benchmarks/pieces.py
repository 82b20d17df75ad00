#!/usr/bin/env python
"""What one piece of mgpu's step costs, measured in the same process(es) (a diagnostic; benchmarks/README.md).

mgpu's Trainer steps the chosen workload in alternating chunks (AB, BA, ...; inprocess.py's pairing) with one
piece of its work switched off or changed (A, "without") and on as mgpu runs it (B, "with") between chunks;
every figure is paired chunk by chunk, so both sides see the same seconds of the machine:

* ``interval``: the log interval (its one all-reduce, the record, metrics.jsonl and TensorBoard, the NaN
  check) every ``trainer.log_every`` steps, against none;
* ``shared``: short log intervals sharing one all-reduce (``REDUCE_EVERY_S``, engine/interval.py), against one
  all-reduce per interval (use ``--chunk 240``: a chunk must span several reductions);
* ``writer``: rank 0's metrics.jsonl and TensorBoard writes, against none (the interval itself stays);
* ``tensorboard``: the TensorBoard event file (written in batches), against none;
* ``tensorboard-unbatched``: each TensorBoard event encoded and written at once, against the batches of 10
  mgpu writes (use ``--chunk 200``: a chunk must hold whole batches);
* ``heartbeat``: the per-rank progress heartbeat, beating ``--hz`` times a second, against paused
  (``--nproc 2`` only: one process has no store). One beat a second is too little to time, so it is
  amplified; ``at_1hz`` scales the ratio back, or use ``--hz 1 --chunk 500`` for chunks of ~1 s.

    python benchmarks/pieces.py --piece interval --rounds 600                # one process (~30 s)
    python benchmarks/pieces.py --piece heartbeat --nproc 2 --rounds 300     # 2 gloo processes, 200 Hz

Prints one JSON object: inprocess.py's chunk-paired summary with A = without the piece, B = with it: its
``cpu_per_step.diff_us`` (B - A) is what the piece costs the training thread per step, and the ratios are
with/without.
"""

from __future__ import annotations

import argparse
import os
import sys
import threading
import time
from dataclasses import replace
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from benchmarks.inprocess import (  # noqa: E402
    gather_chunks,
    mgpu_setup,
    mgpu_teardown,
    mgpu_trainer,
    paired_chunks,
    run_distributed,
    run_worker,
    summarise,
)

PIECES = ("interval", "shared", "writer", "tensorboard", "tensorboard-unbatched", "heartbeat")


def parse_args(argv: list[str] | None = None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--piece", choices=PIECES, required=True)
    p.add_argument("--workload", choices=("mlp", "charlm"), default="mlp")
    p.add_argument("--nproc", type=int, default=1, help="processes (gloo, DDP when > 1); heartbeat needs 2")
    p.add_argument("--rounds", type=int, default=300, help="with/without chunk pairs (default 300)")
    p.add_argument("--chunk", type=int, default=20, help="steps per chunk (default 20)")
    p.add_argument("--hz", type=float, default=200.0, help="heartbeat: beats a second while beating (default 200)")
    p.add_argument("--timeout", type=float, default=900, help="seconds a --nproc run may take")
    args = p.parse_args(argv)
    if args.piece == "heartbeat" and args.nproc < 2 and "LOCAL_RANK" not in os.environ:  # (workers get no --nproc)
        p.error("--piece heartbeat needs --nproc 2: the heartbeat writes to the job's store, which one process lacks")
    return args


class Pacer:
    """Calls ``beat`` about ``hz`` times a second while enabled, from a daemon thread; counts the calls and the
    seconds it was enabled."""

    def __init__(self, beat, hz: float):
        self.beat, self.period = beat, 1.0 / hz
        self.beats, self.enabled_s = 0, 0.0
        self._on = threading.Event()
        self._since = 0.0
        self._thread = threading.Thread(target=self._run, name="heartbeat-pacer", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while True:
            self._on.wait()
            self.beat()
            self.beats += 1
            time.sleep(self.period)

    def set(self, enabled: bool) -> None:
        if enabled and not self._on.is_set():
            self._since = time.perf_counter()
            self._on.set()
        elif not enabled and self._on.is_set():
            self._on.clear()
            self.enabled_s += time.perf_counter() - self._since

    @property
    def rate(self) -> float:
        return self.beats / self.enabled_s if self.enabled_s > 0 else 0.0


def scaled_to_1hz(ratio: float, rate: float) -> float:
    """A ratio measured at ``rate`` beats a second, for one beat a second (the cost is linear in beats)."""
    return 1.0 + (ratio - 1.0) / rate if rate > 0 else float("nan")


def switch(trainer, piece: str, hz: float):
    """``set(on)``: the piece as mgpu runs it (True) or without it (False), for this trainer; and the heartbeat's
    pacer (None for other pieces)."""
    from mgpucli.engine import interval

    hot, writer = trainer.hot, trainer.writer
    reduce_every_s = interval.REDUCE_EVERY_S
    tb = writer._tb if writer is not None else None
    pacer = None
    if piece == "heartbeat":
        if trainer.progress._store is None:
            raise SystemExit("pieces.py: no heartbeat store (run --piece heartbeat with --nproc 2)")
        trainer.progress.stop()  # its own 1 Hz thread: the pacer beats instead, only in B's chunks
        pacer = Pacer(trainer.progress._beat, hz)

    def set_piece(on: bool) -> None:
        if piece == "interval":
            trainer.hot = hot if on else replace(hot, log_every=10**9)
        elif piece == "shared":  # every rank switches at the same step, so they agree on each reduction's size
            interval.REDUCE_EVERY_S = reduce_every_s if on else 0.0
        elif piece == "writer":
            trainer.writer = writer if on else None
        elif piece == "tensorboard" and writer is not None:
            writer._tb = tb if on else None
        elif piece == "tensorboard-unbatched" and tb is not None:
            tb.flush()  # between chunks: neither side inherits the other's queue
            tb.max_queue = 1 if on else 10
        elif piece == "heartbeat":
            pacer.set(on)

    return set_piece, pacer


def measure(args) -> dict | None:
    trainer, rt = mgpu_setup(args.workload, [])
    try:
        set_piece, pacer = switch(trainer, args.piece, args.hz)
        step = mgpu_trainer(trainer)
        chunks = paired_chunks({"A": step, "B": step}, args.rounds, args.chunk, rt.distributed,
                               before_chunk=lambda side: set_piece(side == "B"))
        set_piece(True)
        if pacer is not None:
            pacer.set(False)
        everyone = gather_chunks(chunks, rt)
        rates = gather_chunks({"rate": pacer.rate if pacer is not None else 0.0}, rt)
        if rt.rank != 0:
            return None
        out = summarise(args, everyone, trainer.hot.log_every, rt.cpu_threads)
        out["piece"] = args.piece
        if pacer is not None:
            rate = min(r["rate"] for r in rates)
            out["beats_per_s"] = rate
            out["at_1hz"] = {name: {"ratio": scaled_to_1hz(out[name]["ratio"]["median"], rate),
                                    "ci95": [scaled_to_1hz(out[name]["ratio_ci95"][k], rate) for k in ("low", "high")]}
                             for name in ("wall_per_step_mean", "wall_per_step_median")}
        return out
    finally:
        mgpu_teardown(trainer)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.nproc > 1 and "LOCAL_RANK" not in os.environ:
        worker = ["--piece", args.piece, "--workload", args.workload, "--rounds", str(args.rounds),
                  "--chunk", str(args.chunk), "--hz", str(args.hz)]
        return run_distributed(__file__, worker, args.nproc, args.timeout)
    return run_worker(measure, args)


if __name__ == "__main__":
    sys.exit(main())
