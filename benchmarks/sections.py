#!/usr/bin/env python
"""A diagnostic: where mgpu's extra time per step goes, section by section, against the hand-written loop.

Both loops run in the same process(es), as in benchmarks/inprocess.py, alternating chunks of ``--chunk`` steps.
Each section of a step is timed where it is called (wall clock, ``perf_counter_ns``, a wrapper around the call):

* on both sides: ``loader`` (the next batch), ``forward`` (the model's), ``loss``, ``backward``,
  ``optimizer.step``, ``zero_grad``, ``scheduler.step``;
* on mgpu's side only: ``to_device`` (the Trainer's batch mover), ``step_stats`` (the task's metric pieces),
  ``_close_interval``, ``_start_reduction`` and ``_finish_reduction`` (the log interval: its sums, the
  all-reduce of the closed intervals, and the records);
* ``rest``: the step's time outside them (the loop's own lines, the Trainer's bookkeeping).

It prints, per section, the time per step of each side and B - A. The wrappers cost ~0.1 us a call on both
sides; run it on an idle machine. With ``--nproc 2`` (DDP over gloo) the table is rank 0's.

    python benchmarks/sections.py --workload mlp --rounds 300              # one process, ~1 min
    python benchmarks/sections.py --workload mlp --nproc 2 --rounds 300    # rank 0 of 2 gloo processes
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import sys
import time
from collections import defaultdict
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

SHARED = ("loader", "forward", "loss", "backward", "optimizer.step", "zero_grad", "scheduler.step")
MGPU_ONLY = ("to_device", "step_stats", "_close_interval", "_start_reduction", "_finish_reduction")


class Clock:
    """Nanoseconds per (side, section); ``side`` is the side whose chunk is running."""

    def __init__(self) -> None:
        self.ns: dict[tuple[str, str], int] = defaultdict(int)
        self.side = "A"

    def wrap(self, section: str, fn):
        @functools.wraps(fn)
        def timed(*args, **kwargs):
            started = time.perf_counter_ns()
            try:
                return fn(*args, **kwargs)
            finally:
                self.ns[(self.side, section)] += time.perf_counter_ns() - started

        return timed


def instrument_hand_written(clock: Clock) -> None:
    """Wrap what benchmarks/handwritten.build returns: the model's forward, the loss, the optimizer and the
    scheduler (inprocess.hand_written builds side A through it)."""
    from benchmarks import handwritten

    build = handwritten.build

    def timed_build(workload):
        train_set, model, loss_fn, make_optim = build(workload)
        model.forward = clock.wrap("forward", model.forward)

        def timed_optim(params):
            optimizer, scheduler = make_optim(params)
            _wrap_optim(clock, optimizer, scheduler)
            return optimizer, scheduler

        return train_set, model, clock.wrap("loss", loss_fn), timed_optim

    handwritten.build = timed_build


def instrument_trainer(clock: Clock, trainer) -> None:
    """Wrap the same calls in mgpu's Trainer, and the ones only it makes."""
    model = trainer.wrapped.train
    inner = getattr(model, "module", model)  # DDP calls the module's forward
    inner.forward = clock.wrap("forward", inner.forward)
    trainer.task.loss = clock.wrap("loss", trainer.task.loss)
    trainer.task.step_stats = clock.wrap("step_stats", trainer.task.step_stats)
    trainer._to_device = clock.wrap("to_device", trainer._to_device)
    for name in ("_close_interval", "_start_reduction", "_finish_reduction"):
        setattr(trainer, name, clock.wrap(name, getattr(trainer, name)))
    _wrap_optim(clock, trainer.optimizer, trainer.scheduler)


def _wrap_optim(clock: Clock, optimizer, scheduler) -> None:
    optimizer.step = clock.wrap("optimizer.step", optimizer.step)
    optimizer.zero_grad = clock.wrap("zero_grad", optimizer.zero_grad)
    if scheduler is not None:
        scheduler.step = clock.wrap("scheduler.step", scheduler.step)


def instrument_loaders(clock: Clock) -> None:
    """Time each batch taken from either side's loader (inprocess._endless feeds both)."""
    from benchmarks import inprocess

    endless = inprocess._endless

    def timed_endless(loader, sampler):
        batches = endless(loader, sampler)
        while True:
            started = time.perf_counter_ns()
            batch = next(batches)
            clock.ns[(clock.side, "loader")] += time.perf_counter_ns() - started
            yield batch

    inprocess._endless = timed_endless


def instrument_backward(clock: Clock) -> None:
    import torch

    backward = torch.Tensor.backward

    def timed_backward(self, *args, **kwargs):
        return clock.wrap("backward", backward)(self, *args, **kwargs)

    torch.Tensor.backward = timed_backward


def table(clock: Clock, steps: dict[str, int]) -> list[str]:
    """Per section: us per step of A and B, and B - A; then ``rest`` and the whole step."""
    def per_step(side: str, section: str) -> float:
        return clock.ns[(side, section)] / max(steps[side], 1) / 1e3

    lines = ["| section | hand-written (A) us/step | mgpu (B) us/step | B - A |", "|---|---|---|---|"]
    for section in (*SHARED, *MGPU_ONLY):
        a, b = per_step("A", section), per_step("B", section)
        lines.append(f"| {section} | {a:.2f} | {b:.2f} | {b - a:+.2f} |")
    rest = {s: per_step(s, "step") - sum(per_step(s, n) for n in (*SHARED, *MGPU_ONLY)) for s in "AB"}
    lines.append(f"| rest (the loop, bookkeeping) | {rest['A']:.2f} | {rest['B']:.2f} | "
                 f"{rest['B'] - rest['A']:+.2f} |")
    a, b = per_step("A", "step"), per_step("B", "step")
    lines.append(f"| **whole step** | {a:.2f} | {b:.2f} | {b - a:+.2f} |")
    return lines


def measure(args) -> list[str] | None:
    """Both sides in this process, instrumented, stepped by inprocess.paired_chunks; rank 0 returns the table."""
    from benchmarks import inprocess

    clock = Clock()
    instrument_hand_written(clock)
    instrument_backward(clock)
    instrument_loaders(clock)
    trainer, rt = inprocess.mgpu_setup(args.workload, [])
    try:
        instrument_trainer(clock, trainer)
        sides = {"A": inprocess.hand_written(args.workload, rt, rt.device), "B": inprocess.mgpu_trainer(trainer)}
        started = 0

        def before_chunk(side: str) -> None:
            nonlocal started
            started += 1
            if started == 2 * inprocess.WARMUP_PAIRS + 1:  # the warm-up's sections go, as its steps do
                clock.ns.clear()
            clock.side = side

        chunks = inprocess.paired_chunks(sides, args.rounds, args.chunk, rt.distributed, before_chunk)
        steps = {side: sum(len(walls) for _, walls in kept) for side, kept in chunks.items()}
        for side, kept in chunks.items():
            clock.ns[(side, "step")] = round(1e9 * sum(sum(walls) for _, walls in kept))
        if rt.rank != 0:
            return None
        return [f"sections of a step, {args.workload}, {rt.world_size} process(es), {args.rounds} chunk pairs of "
                f"{args.chunk} steps (rank 0):", "", *table(clock, steps)]
    finally:
        inprocess.mgpu_teardown(trainer)


def parse_args(argv: list[str] | None = None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--workload", choices=["mlp", "charlm"], default="mlp")
    p.add_argument("--rounds", type=int, default=300, help="A/B chunk pairs (default 300)")
    p.add_argument("--chunk", type=int, default=20, help="steps per chunk (default 20, the MLP's log_every)")
    p.add_argument("--nproc", type=int, default=1, help="processes (gloo, DDP on both sides when > 1)")
    p.add_argument("--timeout", type=float, default=900, help="seconds the --nproc run may take")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.nproc > 1 and "LOCAL_RANK" not in os.environ:  # launch the workers; rank 0 prints the table as JSON
        from benchmarks.inprocess import distributed_json

        result = distributed_json(__file__, ["--workload", args.workload, "--rounds", str(args.rounds),
                                             "--chunk", str(args.chunk)], args.nproc, args.timeout)
        if "error" in result:
            print(result["error"], file=sys.stderr)
            return result.get("rc", 1)
        print("\n".join(result["table"]))
        return 0
    import torch

    torch.set_num_threads(int(os.environ.setdefault("OMP_NUM_THREADS", "1")))
    lines = measure(args)
    if lines is not None:
        print(json.dumps({"table": lines}) if "LOCAL_RANK" in os.environ else "\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
