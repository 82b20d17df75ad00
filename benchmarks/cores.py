"""Step time of both whole jobs, run at the same time, each confined to a core of its own: a diagnostic.

benchmarks/overhead.py's rounds run the two jobs one after the other, and on this shared 2-core machine the step
time of the same code moves by tens of percent between runs: each run's threads land on the cores in a different
way, and the machine itself drifts. Here both jobs (each with all its ranks) start together, each confined to one of
the first two cores this process may use (CPU affinity, inherited by every process and thread they start), and the
next round swaps the cores. Both jobs then see the same seconds of the machine, and each rank shares its core with
the same threads on both sides (its job's other rank and their gloo threads), so the thread placement that makes
separate runs bimodal is the same for both. A round's figure is each job's median step (and its mean training-thread
CPU per step) over the seconds both were stepping, between consecutive steps of one epoch; the ratio is paired
within the round, and the rounds are summarised by their median with a 95% interval (benchmarks/stats.py).

A diagnostic (``overhead.py --cores N``, or this script for comparing mgpu with a variant of itself), not a target's
measurement: two ranks on one core step about twice as slowly as on two, and they switch between each other on every
collective, which is not what a user runs. What it does well is compare whole processes (launcher, start-up state,
heap, threads) on the same seconds of the machine: per-round ratios spread over about +-5-10% here, where separate
runs spread over +-20%. Linux only (``os.sched_setaffinity``).

    python benchmarks/cores.py --rounds 16                      # mgpu (B) against the hand-written loop (A)
    python benchmarks/cores.py --rounds 16 --sides B,B+no-freeze  # mgpu against mgpu with a probe experiment
"""

from __future__ import annotations

import argparse
import math
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from benchmarks.children import end_tree, exit_on_sigterm  # noqa: E402
from benchmarks.interleaved import rank_steps  # noqa: E402
from benchmarks.procinfo import spin_seconds  # noqa: E402
from benchmarks.stats import median, median_interval, spread, step_intervals, window  # noqa: E402

SETTLE_S = 0.3  # steps counted from this long after both jobs have started stepping
EPOCHS = {"mlp": 30, "charlm": 4}  # per job: both jobs step together for several seconds (~8 s for the MLP)


@dataclass
class Pair:
    """One round: per side (in the order given), each rank's step records ``(step, epoch, perf_counter,
    process_time, thread_time)``."""

    cores: tuple[int, ...]
    steps: list[list[list[tuple]]]
    error: str | None = None


def side_spec(side: str) -> tuple[str, str]:
    """``"B+no-freeze,plain-loader"`` -> ``("B", "no-freeze,plain-loader")``: the job (A or B) and the probe
    experiments (benchmarks/probe/sitecustomize.py) of mgpu's side; the hand-written loop's are
    ``A+mgpu-imports`` and ``A+spin-US`` (benchmarks/handwritten.py)."""
    job, _, experiment = side.partition("+")
    if job not in ("A", "B") or (job == "A" and not _loop_experiment(experiment)):
        raise ValueError(f"side {side!r}: A, A+mgpu-imports, A+spin-US, or B+EXPERIMENT[,EXPERIMENT] (the probe's "
                         "experiments are mgpu's side's)")
    return job, experiment


def _loop_experiment(experiment: str) -> bool:
    """The hand-written loop's diagnostics (benchmarks/handwritten.py): none, ``mgpu-imports``, ``spin-US``."""
    return experiment in ("", "mgpu-imports") or spin_seconds(experiment) is not None


def overlap(steps: list[list[list[tuple]]], settle: float = SETTLE_S) -> tuple[float, float]:
    """The seconds (perf_counter) in which every rank of both jobs was stepping: from ``settle`` after the last
    first step to the first last step."""
    ranks = [records for per_side in steps for records in per_side]
    if not ranks or not all(ranks):
        return math.inf, -math.inf  # a rank without steps: no window
    return max(r[0][2] for r in ranks) + settle, min(r[-1][2] for r in ranks)


def window_figures(ranks: list[list[tuple]], lo: float, hi: float) -> tuple[float, float, int]:
    """(median step, mean training-thread CPU per step, steps) over ``[lo, hi]``: intervals between consecutive
    steps of one epoch, every rank pooled (they move in lockstep). NaN where no step fits."""
    steps, cpu_steps, cpu_total = [], 0, 0.0
    for records in ranks:
        inside = [r for r in records if lo <= r[2] <= hi]  # in time order: neighbours here were neighbours there
        steps += step_intervals([(s, e, t) for s, e, t, *_ in inside], warmup=0)
        n, total = window([(r[0], r[1], r[4]) for r in inside], warmup=0)  # training-thread CPU, same intervals
        cpu_steps, cpu_total = cpu_steps + n, cpu_total + total
    if not steps:
        return float("nan"), float("nan"), 0
    return median(steps), cpu_total / cpu_steps, len(steps)


def _pinned(core: int):
    def pin() -> None:  # runs in the child before exec: every process and thread it starts inherits the mask
        os.sched_setaffinity(0, {core})
    return pin


def run_pair(workload: str, rnd: int, sides: Sequence[str], cores: Sequence[int], args, root: Path, cwd: Path,
             command, environment) -> Pair:
    """Start both jobs at once, ``sides[i]`` on ``cores[i]``; wait for both (each bounded by ``args.timeout``).
    ``command(job, workload, args, out)`` and ``environment(job, args, out)`` are overhead.py's."""
    args = argparse.Namespace(**{**vars(args), "epochs": args.epochs or EPOCHS[workload]})
    procs: list[subprocess.Popen] = []
    outs: list[Path] = []
    try:
        for i, (side, core) in enumerate(zip(sides, cores, strict=True)):
            job, experiment = side_spec(side)
            out = root / f"cores-{workload}" / f"r{rnd:02d}-{i}{job}"
            out.mkdir(parents=True)
            outs.append(out)
            env = environment(job, args, out)
            if experiment:
                env["MGPU_BENCH_EXPERIMENT"] = experiment
            with open(out / "output.log", "w") as log:
                procs.append(subprocess.Popen(command(job, workload, args, out), cwd=cwd, env=env, stdout=log,
                                               stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                               start_new_session=True, preexec_fn=_pinned(core)))
        deadline = time.monotonic() + args.timeout
        for side, proc in zip(sides, procs, strict=True):
            try:
                proc.wait(timeout=max(1.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                return Pair(tuple(cores), [], f"{side} did not finish within {args.timeout:.0f} s")
    finally:
        for proc in procs:
            end_tree(proc)
    steps = []
    for side, proc, out in zip(sides, procs, outs, strict=True):
        records, error = rank_steps(side, proc.returncode, out, args.nproc)
        if error:
            return Pair(tuple(cores), [], error)
        steps.append(records)
    return Pair(tuple(cores), steps)


def measure(workload: str, rounds: int, args, root: Path, cwd: Path, command, environment, progress,
            sides: Sequence[str] = ("A", "B")) -> dict[str, Any]:
    """``rounds`` pairs of jobs on the first two cores this process may use, swapping them every round; the second
    side over the first, per round."""
    first, second = sides
    step_ratios: list[float] = []
    cpu_ratios: list[float] = []
    figures: list[list[float]] = [[], []]
    errors = []
    usable = sorted(os.sched_getaffinity(0))[:2] if hasattr(os, "sched_getaffinity") else []
    if len(usable) < 2:
        errors.append("needs 2 cores this process may use (one per job); skipped")
        rounds = 0
    for rnd in range(rounds):
        cores = tuple(usable) if rnd % 2 == 0 else tuple(reversed(usable))
        pair = run_pair(workload, rnd, sides, cores, args, root, cwd, command, environment)
        if pair.error:
            errors.append(pair.error)
            progress(f"[{workload} cores {rnd + 1}/{rounds}] failed: {pair.error}")
            continue
        lo, hi = overlap(pair.steps)
        (m0, c0, n0), (m1, c1, n1) = (window_figures(ranks, lo, hi) for ranks in pair.steps)
        if not (n0 and n1):
            errors.append(f"round {rnd}: the jobs did not step together for long enough ({hi - lo:.2f} s)")
            continue
        step_ratios.append(m1 / m0)
        cpu_ratios.append(c1 / c0)
        figures[0].append(m0)
        figures[1].append(m1)
        progress(f"[{workload} cores {rnd + 1}/{rounds}] {first} on core {cores[0]}, {second} on core {cores[1]}, "
                 f"{hi - lo:.1f} s together: median step {1e3 * m0:.3f} / {1e3 * m1:.3f} ms ({m1 / m0:.3f}), "
                 f"training-thread CPU per step {c1 / c0:.3f}")
    return {"rounds": rounds, "sides": list(sides), "epochs": args.epochs or EPOCHS[workload],
            "step_ratios": step_ratios, "cpu_ratios": cpu_ratios,
            "step": spread(step_ratios), "step_ci95": median_interval(step_ratios),
            "cpu": spread(cpu_ratios), "cpu_ci95": median_interval(cpu_ratios),
            "ms": [1e3 * median(v) if v else float("nan") for v in figures], "errors": errors}


def report(workload: str, d: dict[str, Any], target: float) -> tuple[list[str], dict[str, Any]]:
    """overhead.py's rows for :func:`measure`'s result. A diagnostic beside the rounds: no verdict (the target is
    shown for reference and cannot fail the run)."""
    first, second = d["sides"]
    names = {"A": "hand-written (A)", "B": "mgpu (B)"}
    lines = [f"whole jobs at once, each on a core of its own ({d['rounds']} rounds of {d['epochs']} epochs per job, "
             "cores swapped every round; benchmarks/cores.py; a diagnostic, no verdict):", "",
             f"| metric | {names.get(first, first)} | {names.get(second, second)} | "
             f"{second}/{first} per round: median (IQR, range) | "
             "95% interval of that median | the rounds' target |", "|---|---|---|---|---|---|",
             f"| step time, median over the seconds both stepped | {d['ms'][0]:.3f} ms | {d['ms'][1]:.3f} ms "
             f"| {d['step'].fmt(3)} | {d['step_ci95'].fmt(3)} | <= {target:.2f} |",
             f"| training-thread CPU per step | | | {d['cpu'].fmt(3)} | {d['cpu_ci95'].fmt(3)} | |"]
    lines += [f"\nround failed: {e}" for e in d["errors"]]
    data = {k: v for k, v in d.items() if k not in ("step", "step_ci95", "cpu", "cpu_ci95")}
    return lines, data | {name: asdict(d[name]) for name in ("step", "step_ci95", "cpu", "cpu_ci95")} | {
        "target": target}


def main(argv: list[str] | None = None) -> int:
    from benchmarks import overhead

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--workload", choices=sorted(EPOCHS), default="mlp")
    p.add_argument("--rounds", type=int, default=16)
    p.add_argument("--sides", default="A,B",
                   help="two sides, second over first: A, A+mgpu-imports, A+spin-US, B, or B+EXPERIMENT")
    p.add_argument("--epochs", type=int, default=None, help=f"epochs per job (default {EPOCHS})")
    p.add_argument("--timeout", type=float, default=600.0, help="seconds one round may take")
    a = p.parse_args(argv)
    sides = a.sides.split(",", 1)
    if len(sides) != 2:
        p.error("--sides takes two sides, e.g. A,B or B,B+no-freeze")
    for side in sides:
        try:
            side_spec(side)
        except ValueError as err:
            p.error(str(err))
    exit_on_sigterm()  # stopped, it kills both jobs' process trees (run_pair's finally)
    args = overhead.parse_args(["--workload", a.workload, "--no-audit", "--timeout", str(a.timeout)])
    args.epochs = a.epochs
    with tempfile.TemporaryDirectory(prefix="mgpu-cores-") as root:
        d = measure(a.workload, a.rounds, args, Path(root), REPO, overhead.command, overhead.environment,
                    lambda line: print(line, file=sys.stderr, flush=True), sides)
    for name in ("step", "cpu"):
        what = "median step" if name == "step" else "training-thread CPU per step"
        print(f"{sides[1]}/{sides[0]} {what}: {d[name].fmt(3)}; 95% interval of the median {d[name + '_ci95'].fmt(3)}")
    for e in d["errors"]:
        print(f"failed: {e}")
    return 1 if d["errors"] and not d["step_ratios"] else 0


if __name__ == "__main__":
    sys.exit(main())
