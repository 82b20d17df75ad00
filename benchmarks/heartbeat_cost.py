#!/usr/bin/env python
"""What mgpu's heartbeat costs a training step, measured amplified (a diagnostic; see benchmarks/README.md).

Every mgpu worker runs a thread that writes its progress to the job's store once a second
(mgpucli/dist/watch.py), so that a collective's timeout can say which rank was late. One write a second is far
too little to time directly against a noise of several percent, so this measures it many times over: mgpu's
Trainer steps in the same 2 processes, alternating chunks of steps with the heartbeat paused (A) and beating
``--hz`` times a second (B), each beat the real one (``Progress._beat``: a JSON record and a store ``set``).
The chunk-paired ratio B/A at ``--hz`` beats a second, less one, divided by the beats a second it actually
reached, is the cost of one beat a second; at the default 1 Hz that is mgpu's.

    python benchmarks/heartbeat_cost.py --rounds 300            # 2 gloo processes, 200 Hz (~1 min)

Prints one JSON object: inprocess.py's chunk-paired summary of A (paused) and B (beating), plus the beat rate
reached and the per-step ratio scaled to 1 Hz.
"""

from __future__ import annotations

import argparse
import os
import sys
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from benchmarks.inprocess import (  # noqa: E402
    gather_chunks,
    mgpu_setup,
    mgpu_trainer,
    paired_chunks,
    run_distributed,
    run_worker,
    summarise,
)


def parse_args(argv: list[str] | None = None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--workload", choices=("mlp", "charlm"), default="mlp")
    p.add_argument("--rounds", type=int, default=300, help="paused/beating chunk pairs (default 300)")
    p.add_argument("--chunk", type=int, default=20, help="steps per chunk (default 20)")
    p.add_argument("--hz", type=float, default=200.0, help="beats a second while beating (default 200)")
    p.add_argument("--timeout", type=float, default=900, help="seconds the run may take")
    return p.parse_args(argv)


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


def measure(args) -> dict | None:
    from mgpucli.dist import runtime

    trainer, rt = mgpu_setup(args.workload, [])
    try:
        progress = trainer.progress
        if progress._store is None:
            raise SystemExit("heartbeat_cost.py: no heartbeat store (run it without LOCAL_RANK set: it launches "
                             "itself on 2 processes)")
        progress.stop()  # its own 1 Hz thread: the pacer beats instead, only in B's chunks
        pacer = Pacer(progress._beat, args.hz)
        step = mgpu_trainer(trainer)
        chunks = paired_chunks({"A": step, "B": step}, args.rounds, args.chunk, rt.distributed,
                               before_chunk=lambda side: pacer.set(side == "B"))
        pacer.set(False)
        trainer.close()
        everyone = gather_chunks(chunks, rt)
        rates = gather_chunks({"rate": pacer.rate}, rt)
        if rt.rank != 0:
            return None
        out = summarise(args, everyone, trainer.hot.log_every, int(os.environ.get("OMP_NUM_THREADS", "1")))
        rate = min(r["rate"] for r in rates)
        out["beats_per_s"] = rate
        out["at_1hz"] = {name: {"ratio": scaled_to_1hz(out[name]["ratio"]["median"], rate),
                                "ci95": [scaled_to_1hz(out[name]["ratio_ci95"][k], rate) for k in ("low", "high")]}
                         for name in ("wall_per_step_mean", "wall_per_step_median")}
        return out
    finally:
        runtime.teardown()


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if "LOCAL_RANK" not in os.environ:
        worker = ["--workload", args.workload, "--rounds", str(args.rounds), "--chunk", str(args.chunk),
                  "--hz", str(args.hz)]
        return run_distributed(__file__, worker, 2, args.timeout)
    return run_worker(measure, args)


if __name__ == "__main__":
    sys.exit(main())
