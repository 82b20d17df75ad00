#!/usr/bin/env python
"""mgpu's step path against the hand-written loop's, in the same process(es), alternating steps.

On a shared 2-core machine the step time of 2-process DDP drifts by tens of percent within a run, second to
second (most likely as the scheduler places the processes' threads on the two cores). Separate runs, as
benchmarks/overhead.py makes them, see different stretches of that drift. Here both loops live in the same
processes and take turns every ``--chunk`` steps (default 1: A, B, B, A, A, B, ...; a few milliseconds each),
so both sides see the same stretches, and every figure is paired:

* (A) the hand-written loop of benchmarks/handwritten.py: its own model, optimizer, scheduler, DataLoader with
  DistributedSampler and (with ``--nproc 2``) DDP, and its loop body: ``x.to(device), y.to(device)``, forward,
  ``F.cross_entropy``, ``zero_grad``, ``backward``, (clip), ``step``, (scheduler);
* (B) mgpu's Trainer, built from the recipe as ``mgpu train`` builds it, stepping with
  ``Trainer._forward_backward`` + ``Trainer._optimizer_step``: metric pieces, NaN bookkeeping, progress, and
  every ``log_every`` steps the log interval (its all-reduce, shared between intervals as in a real run, with
  ``--nproc 2``), metrics.jsonl and TensorBoard.

Steps follow each other as in a training loop: no barrier between single steps (DDP's all-reduce in each
keeps the ranks in step); chunks of more steps start together on both ranks (a barrier, outside the timing).
Per chunk it takes the training thread's CPU time and the wall time of each step, from the end of the step
before (a chunk's wall time: the slower rank's). The step-time figure is the ratio of totals, all of mgpu's
steps against all of the hand-written loop's: the ratio of mean step times, every log interval and shared
all-reduce counted. Its 95% interval is a bootstrap over blocks of ``log_every`` steps per side (consecutive
chunk pairs; one log interval each), which keeps the drift's correlation between neighbouring steps inside a
block. Per-step CPU time (B - A) is summarised the same way. The chunk-paired medians of earlier versions
(``--chunk 20``: one log interval a chunk) are still reported: the two chunks of a pair, 20 steps apart,
correlate less (~0.4 on the MLP here, against ~0.6 for blocks of single-step pairs), and a median of chunk
ratios gives little weight to the chunks that carry a shared all-reduce (one in ~8).

Both sides share the process, so glibc's malloc thresholds are fixed for it as ``mgpu train`` fixes them (see
run_worker). What it leaves out, by design: what else differs between whole processes (the launcher,
start-up, mgpu's GC settings and threads); overhead.py measures those.

    python benchmarks/inprocess.py --workload mlp --rounds 400                  # one process, no DDP
    python benchmarks/inprocess.py --workload mlp --nproc 2 --rounds 60000      # 2 gloo processes, DDP (~4-5 min)
    python benchmarks/inprocess.py --workload mlp --rounds 400 --log-every 0    # per-step work only

Prints one JSON object (rank 0's, with every rank's chunks combined).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import sys
import tempfile
import time
from dataclasses import asdict
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

RECIPES = {"mlp": REPO / "recipes" / "quickstart.yaml", "charlm": REPO / "recipes" / "charlm.yaml"}


def parse_args(argv: list[str] | None = None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--workload", choices=sorted(RECIPES), default="mlp")
    p.add_argument("--rounds", type=int, default=400, help="A/B chunk pairs (default 400)")
    p.add_argument("--chunk", type=int, default=1, help="steps per chunk (default 1: the sides alternate steps)")
    p.add_argument("--nproc", type=int, default=1, help="processes (gloo, DDP on both sides when > 1)")
    p.add_argument("--log-every", type=int, default=None, help="trainer.log_every (default: the recipe's; 0: never)")
    p.add_argument("--timeout", type=float, default=900, help="seconds the --nproc run may take")
    return p.parse_args(argv)


def launch(args) -> int:
    """Run this script under torch.distributed.run with ``--nproc`` processes; print rank 0's JSON."""
    return run_distributed(__file__, worker_args(args), args.nproc, args.timeout)


def worker_args(args) -> list[str]:
    """This script's arguments for its workers (not --nproc: torchrun's parser would take it for its own)."""
    worker = ["--workload", args.workload, "--rounds", str(args.rounds), "--chunk", str(args.chunk)]
    return worker + (["--log-every", str(args.log_every)] if args.log_every is not None else [])


def run_distributed(script: str, worker_args: list[str], nproc: int, timeout: float) -> int:
    """``script worker_args`` under torch.distributed.run with ``nproc`` processes (the cores shared between
    them); prints the last JSON line of its output."""
    result = distributed_json(script, worker_args, nproc, timeout)
    if "error" in result:
        print(result["error"], file=sys.stderr)
        return result.get("rc", 1)
    print(json.dumps(result))
    return 0


def distributed_json(script: str, worker_args: list[str], nproc: int, timeout: float,
                     threads: int | None = None) -> dict:
    """``script worker_args`` under torch.distributed.run with ``nproc`` processes, ``threads`` intra-op threads
    each (default: the cores shared between them); the last JSON line its ranks printed, as a dict, or
    ``{"error": why}``."""
    from benchmarks.children import exit_on_sigterm, run_tree
    from mgpucli.cpus import threads_per_process

    threads = threads or threads_per_process(nproc)
    env = {**os.environ, "OMP_NUM_THREADS": str(threads),
           "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(nproc),
           script, *worker_args]
    name = Path(script).name
    exit_on_sigterm()  # this is the launching process: stopped, it kills the workers too (benchmarks/children.py)
    rc, stdout, stderr = run_tree(cmd, env, timeout)
    if rc is None:
        return {"error": f"{name}: the {nproc}-process run took over {timeout:.0f} s"}
    lines = [line for line in stdout.splitlines() if line.startswith("{")]
    if rc != 0 or not lines:
        return {"error": f"{name} exited {rc}: " + (stdout[-3000:] + stderr[-3000:]).strip(), "rc": rc or 1}
    return json.loads(lines[-1])


def hand_written(workload: str, rt, device):
    """Side A: benchmarks/handwritten.py's objects and loop body, as one step per call."""
    import torch
    from torch.utils.data import DataLoader, DistributedSampler

    from benchmarks.handwritten import WORKLOADS, build

    w = WORKLOADS[workload]
    torch.manual_seed(w["seed"])
    train_set, model, loss_fn, make_optim = build(workload)
    sampler = DistributedSampler(train_set, num_replicas=rt.world_size, rank=rt.rank, seed=w["seed"])
    loader = DataLoader(train_set, batch_size=w["batch_size"], sampler=sampler)
    model = model.to(device)
    if rt.distributed:
        model = torch.nn.parallel.DistributedDataParallel(model)
    optimizer, scheduler = make_optim(model.parameters())
    model.train()
    batches = _endless(loader, sampler)
    clip = w["clip_grad_norm"]

    def step() -> None:
        x, y = next(batches)
        x, y = x.to(device), y.to(device)
        loss = loss_fn(model(x), y)
        optimizer.zero_grad()
        loss.backward()
        if clip is not None:
            torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
        optimizer.step()
        if scheduler is not None:
            scheduler.step()

    return step


def mgpu_trainer(trainer):
    """Side B: mgpu's Trainer, one optimizer step per call (the recipe's grad_accum micro-steps).

    The time between two calls (the other side's chunk, the barrier) is not mgpu's: its log interval's clock is
    moved past it, so that the interval's time (a record's samples/s, and the pace that sets how many intervals
    share an all-reduce, engine/interval.py) counts mgpu's own steps, as in a run of mgpu alone."""
    trainer.wrapped.train.train()
    trainer._interval_start, trainer._interval_steps = time.perf_counter(), 0
    batches = _endless(trainer.loaders.train, trainer.loaders.sampler)
    accum = trainer.hot.grad_accum
    returned = [None]  # when the previous call returned

    def step() -> None:
        if returned[0] is not None:
            trainer._interval_start += time.perf_counter() - returned[0]
        for micro in range(accum):
            trainer._forward_backward(next(batches), sync=micro == accum - 1)
        trainer._optimizer_step()
        returned[0] = time.perf_counter()

    return step


def _endless(loader, sampler):
    epoch = 0
    while True:
        sampler.set_epoch(epoch)
        yield from loader
        epoch += 1


def mgpu_setup(workload: str, extra_overrides: list[str]):
    """mgpu's Trainer for ``workload``'s recipe, set up as ``mgpu train`` sets it up (in a fresh run dir), and
    its Runtime; call :func:`mgpu_teardown` when done."""
    from mgpucli.config import load_recipe
    from mgpucli.distributed import runtime
    from mgpucli.distributed.env import read_rank_env
    from mgpucli.engine.reporter import NullReporter
    from mgpucli.engine.trainer import Trainer

    threads = int(os.environ.get("OMP_NUM_THREADS", "1"))
    overrides = [f"run_dir={tempfile.mkdtemp(prefix='mgpu-inprocess-')}/run", "trainer.device=cpu",
                 *extra_overrides]
    cfg = load_recipe(str(RECIPES[workload]), overrides)
    rt = runtime.setup(read_rank_env(), "cpu", 120, threads)
    trainer = Trainer(cfg, rt, NullReporter())
    trainer.setup()
    return trainer, rt


def mgpu_teardown(trainer) -> None:
    """Close the trainer, remove this rank's temporary run dir, destroy the process group."""
    from mgpucli.distributed import runtime

    trainer.close()
    shutil.rmtree(trainer.run_dir.parent, ignore_errors=True)
    runtime.teardown()


WARMUP_PAIRS = 2  # chunk pairs run before the ones paired_chunks keeps


def paired_chunks(sides: dict, rounds: int, chunk: int, distributed: bool, before_chunk=None,
                  barrier: bool = True) -> dict:
    """``rounds`` AB/BA pairs of ``chunk`` calls of each side's step (after WARMUP_PAIRS pairs of warm-up), with
    ``barrier`` both ranks starting each chunk together: ``{side: [(training-thread CPU s, [wall s of each
    step]), ...]}``. ``before_chunk(side)`` runs before every chunk, the warm-up's included."""
    import torch.distributed as dist

    from benchmarks.stats import round_orders

    chunks: dict[str, list[tuple[float, list[float]]]] = {side: [] for side in sides}
    for rnd, order in enumerate(round_orders(rounds + WARMUP_PAIRS)):
        for side in order:
            if before_chunk is not None:
                before_chunk(side)
            if distributed and barrier:
                dist.barrier()  # both ranks start the chunk together
            step, walls = sides[side], []
            cpu0 = time.thread_time()
            before = time.perf_counter()
            for _ in range(chunk):
                step()
                now = time.perf_counter()
                walls.append(now - before)
                before = now
            if rnd >= WARMUP_PAIRS:
                chunks[side].append((time.thread_time() - cpu0, walls))
    return chunks


def gather_chunks(chunks: dict, rt) -> list[dict]:
    """Every rank's chunks (on every rank)."""
    if not rt.distributed:
        return [chunks]
    import torch.distributed as dist

    everyone = [None] * rt.world_size
    dist.all_gather_object(everyone, chunks)
    return everyone


def measure(args) -> dict | None:
    """Both sides in this process; chunk records of this rank (rank 0 returns every rank's summary)."""
    overrides = [f"trainer.log_every={args.log_every or 10**9}"] if args.log_every is not None else []
    trainer, rt = mgpu_setup(args.workload, overrides)
    try:
        sides = {"A": hand_written(args.workload, rt, rt.device), "B": mgpu_trainer(trainer)}
        # A barrier per chunk makes each chunk's wall time its own steps' (chunks of a log interval, whose
        # figures stand alone); single steps are summed over blocks, and a barrier before every step would add a
        # collective and a wait to each that neither loop has (~10% of the MLP's step here).
        chunks = paired_chunks(sides, args.rounds, args.chunk, rt.distributed, barrier=args.chunk > 1)
        everyone = gather_chunks(chunks, rt)
        return summarise(args, everyone, trainer.hot.log_every, rt.cpu_threads) if rt.rank == 0 else None
    finally:
        mgpu_teardown(trainer)


def summarise(args, ranks: list[dict], log_every: int, threads: int) -> dict:
    """Paired figures: CPU per step per rank (mean of ranks), wall per step (the slowest rank's chunk); over
    blocks of ``log_every`` steps per side (see the module docstring), and per chunk."""
    from benchmarks.stats import median, median_interval, paired_ratios, spread

    def per_chunk(side: str, fn) -> list[float]:
        return [fn([r[side][i] for r in ranks]) for i in range(len(ranks[0][side]))]

    n = args.chunk
    cpu = {s: per_chunk(s, lambda cs: sum(c for c, _ in cs) / len(cs) / n) for s in "AB"}
    mean = {s: per_chunk(s, lambda cs: max(sum(w) for _, w in cs) / n) for s in "AB"}
    med = {s: per_chunk(s, lambda cs: max(median(w) for _, w in cs)) for s in "AB"}

    def ratio(series: dict[str, list[float]]) -> dict:
        r = paired_ratios(series["B"], series["A"])
        return {"A_us": 1e6 * median(series["A"]), "B_us": 1e6 * median(series["B"]),
                "ratio": asdict(spread(r)), "ratio_ci95": asdict(median_interval(r))}

    diff = [1e6 * (b - a) for a, b in zip(cpu["A"], cpu["B"], strict=True)]
    return {
        "workload": args.workload, "processes": len(ranks), "threads_per_process": threads,
        "log_every": log_every, "rounds": args.rounds, "chunk": n,
        "blocks": summarise_blocks(mean, cpu, max(1, block_steps(log_every) // n), n),
        "cpu_per_step": {"A_us": 1e6 * median(cpu["A"]), "B_us": 1e6 * median(cpu["B"]),
                         "diff_us": asdict(spread(diff)), "diff_us_ci95": asdict(median_interval(diff)),
                         "ratio": asdict(spread(paired_ratios(cpu["B"], cpu["A"])))},
        "wall_per_step_mean": ratio(mean),
        "wall_per_step_median": ratio(med),
    }


def summarise_blocks(wall: dict[str, list[float]], cpu: dict[str, list[float]], block: int, chunk: int) -> dict:
    """Totals over blocks of ``block`` chunk pairs (``wall``/``cpu``: each chunk's seconds per step, per side):
    mean step and CPU per step of each side, the ratio of totals B/A and CPU B - A, with bootstrap intervals."""
    from benchmarks.stats import (
        block_sums,
        bootstrap_interval,
        median_interval,
        paired_ratios,
        ratio_of_totals,
        spread,
        totals_ratio_interval,
    )

    w = {s: block_sums(wall[s], block) for s in "AB"}  # a block's seconds per step, summed over its chunks
    c = list(zip(*(block_sums(cpu[s], block) for s in "AB"), strict=True))
    count = len(c)

    def per_step_us(total: float, blocks: int) -> float:
        return 1e6 * total / (blocks * block) if blocks else math.nan

    def cpu_diff_us(blocks) -> float:
        return per_step_us(math.fsum(b - a for a, b in blocks), len(blocks))

    ratios = paired_ratios(w["B"], w["A"])
    return {"n": count, "steps_per_side": block * chunk,
            "A_us": per_step_us(math.fsum(w["A"]), count), "B_us": per_step_us(math.fsum(w["B"]), count),
            "ratio": ratio_of_totals(w["B"], w["A"]), "ratio_ci95": asdict(totals_ratio_interval(w["B"], w["A"])),
            "block_ratio": asdict(spread(ratios)), "block_ratio_ci95": asdict(median_interval(ratios)),
            "cpu_A_us": per_step_us(math.fsum(a for a, _ in c), count),
            "cpu_B_us": per_step_us(math.fsum(b for _, b in c), count),
            "cpu_diff_us": cpu_diff_us(c), "cpu_diff_us_ci95": asdict(bootstrap_interval(c, cpu_diff_us))}


def block_steps(log_every: int) -> int:
    """Steps per side in a block: one log interval (20 where intervals are off or longer than 1000 steps)."""
    return log_every if 0 < log_every <= 1000 else 20


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.nproc > 1 and "LOCAL_RANK" not in os.environ:
        return launch(args)
    return run_worker(measure, args)


def run_worker(measure_fn, args) -> int:
    """In a worker process (or alone): glibc's malloc thresholds fixed as ``mgpu train`` fixes them, torch's
    intra-op threads from OMP_NUM_THREADS, then ``measure_fn(args)``; prints its result (rank 0's) as one JSON
    line.

    The thresholds are the process's, so both sides share them. Left to adapt, they follow the process's
    history: which side's step finds its freed memory trimmed and faults it in again is a lottery drawn per
    process, and on the char LM it moved the ratio by ~1% from run to run with tight intervals inside each
    (training-thread CPU per step B - A: -57 us in one run, +562 us in the next). Fixed, neither side pays it."""
    from mgpucli.heap import steady_heap

    steady_heap()  # before torch's first large allocation
    import torch

    torch.set_num_threads(int(os.environ.setdefault("OMP_NUM_THREADS", "1")))
    result = measure_fn(args)
    if result is not None:
        print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
