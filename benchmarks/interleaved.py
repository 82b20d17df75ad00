"""Step time of both whole jobs, time-sliced against each other: the end-to-end comparison, resolved.

benchmarks/overhead.py's rounds run the two jobs one after the other, and on a shared 2-core machine the step
time drifts by tens of percent from one second to the next, so separate runs see different stretches of that
drift. Here both jobs are started (each alone until it trains), then take turns: every ``slice`` seconds the
controller freezes every process of one job (SIGSTOP: its launcher and workers) and thaws the other's
(SIGCONT). Both jobs see the same seconds of the machine, a fraction of a second apart. A step counts for a
slice only if it started and finished inside it (after the slice's first ``SKIP`` steps: the caches the other
job left cold); its clock is ``time.perf_counter``, which on Linux is CLOCK_MONOTONIC, the controller's clock
too. Each slice is summarised by its median step; adjacent A and B slices are paired, and the B/A ratios are
summarised by their median with a 95% interval (benchmarks/stats.py).

A diagnostic (``overhead.py --interleaved N``), not a target's measurement: on this machine a slice is either
"fast" (steps ~1.1 ms) or "slow" (~1.7 ms) as the scheduler happens to place the four threads of each job, and
sessions differ from one another as separate runs do. What it shows well is the fast slices of both jobs side by
side. It leaves out start-up and the first step (overhead.py's rounds measure them), and a job paused every
quarter of a second is not what a user runs (both jobs get the same pauses). Linux only (/proc, SIGSTOP).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import subprocess
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from benchmarks.children import end_tree
from benchmarks.stats import median, median_interval, spread, step_intervals
from mgpucli.proctree import descendants

SKIP = 3  # steps left out at the start of every slice
SETTLE_S = 7.0  # a job's time alone before the slicing starts: start-up (~3.5 s) and its first steps
# Per workload: slice length, and epochs per job (enough steps that neither job ends while slicing goes on).
SLICE_S = {"mlp": 0.25, "charlm": 1.0}
EPOCHS = {"mlp": 120, "charlm": 8}


@dataclass
class Session:
    """One interleaved pair of jobs: the slices (side, start, end) and each side's per-rank step records."""

    slices: list[tuple[str, float, float]]
    steps: dict[str, list[list[tuple[int, int, float]]]]  # side -> per rank -> (step, epoch, perf_counter)
    error: str | None = None


def slice_medians(slices: Sequence[tuple[str, float, float]], steps: dict[str, list[list[tuple[int, int, float]]]],
                  skip: int = SKIP) -> list[tuple[str, float]]:
    """(side, median step) per slice, from the steps that started and finished inside it, after the first
    ``skip``; every rank's steps pooled (they move in lockstep). Slices with fewer than 3 such steps are left
    out."""
    out = []
    for side, start, end in slices:
        durations = []
        for records in steps[side]:
            # records are in time order: two consecutive ones inside the slice are consecutive in the run
            durations += step_intervals([r for r in records if start <= r[2] <= end], warmup=0)[skip:]
        if len(durations) >= 3:
            out.append((side, median(durations)))
    return out


def paired_slice_ratios(medians: Sequence[tuple[str, float]]) -> list[float]:
    """B/A for pairs of adjacent A and B slices, every third slice starting a pair, so that the pairs take the
    jobs in alternating order (BA, AB, BA, ... when the slices alternate): whichever job runs second in a pair
    (after the other's caches, on a drifting machine) is each job half the time. Pairing every two slices
    would always put the same job first; in A/A checks (both jobs hand-written) that alone gave 0.979."""
    ratios, i = [], 0
    while i + 1 < len(medians):
        (s0, m0), (s1, m1) = medians[i], medians[i + 1]
        if s0 != s1:
            a, b = (m0, m1) if s0 == "A" else (m1, m0)
            ratios.append(b / a)
            i += 3
        else:
            i += 1
    return ratios


def _signal_tree(pids: list[int], sig: int) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, sig)


def _tree(proc: subprocess.Popen) -> list[int]:
    return [proc.pid, *descendants(proc.pid)]


def run_session(workload: str, session: int, args, root: Path, cwd: Path, command, environment) -> Session:
    """Start A, let it settle, freeze it; start B, let it settle; then alternate until either job ends.
    ``command(side, workload, args, out)`` and ``environment(side, args, out)`` are overhead.py's."""
    procs: dict[str, subprocess.Popen] = {}
    outs: dict[str, Path] = {}
    slices: list[tuple[str, float, float]] = []
    slice_s = args.slice or SLICE_S[workload]
    args = argparse.Namespace(**{**vars(args), "epochs": EPOCHS[workload]})
    try:
        for side in ("A", "B"):
            out = root / f"interleaved-{workload}" / f"s{session:02d}-{side}"
            out.mkdir(parents=True)
            outs[side] = out
            cmd = command(side, workload, args, out)
            with open(out / "output.log", "w") as log:
                procs[side] = subprocess.Popen(cmd, cwd=cwd, env=environment(side, args, out), stdout=log,
                                               stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                               start_new_session=True)
            time.sleep(SETTLE_S)
            if procs[side].poll() is not None:
                return Session([], {}, f"{side} ended during its {SETTLE_S:.0f} s alone (exit "
                                       f"{procs[side].returncode}); see {out / 'output.log'}")
            if side == "A":
                _signal_tree(_tree(procs["A"]), signal.SIGSTOP)
        trees = {side: _tree(p) for side, p in procs.items()}  # the workers run by now: no new processes
        running = "B"
        start = time.perf_counter()
        deadline = time.monotonic() + args.timeout
        while all(p.poll() is None for p in procs.values()) and time.monotonic() < deadline:
            time.sleep(slice_s)
            other = "A" if running == "B" else "B"
            _signal_tree(trees[running], signal.SIGSTOP)
            end = time.perf_counter()
            slices.append((running, start, end))
            _signal_tree(trees[other], signal.SIGCONT)
            start, running = time.perf_counter(), other
        slices.append((running, start, time.perf_counter()))
        for side in procs:
            _signal_tree(trees[side], signal.SIGCONT)
        for side, proc in procs.items():
            try:
                proc.wait(timeout=args.timeout)
            except subprocess.TimeoutExpired:
                return Session(slices, {}, f"{side} did not finish within {args.timeout:.0f} s")
    finally:
        for proc in procs.values():
            _signal_tree(_tree(proc), signal.SIGCONT)
            end_tree(proc)
    steps: dict[str, list[list[tuple[int, int, float]]]] = {}
    for side, out in outs.items():
        records, error = rank_steps(side, procs[side].returncode, out, args.nproc)
        if error:
            return Session(slices, {}, error)
        steps[side] = [[(s, e, t) for s, e, t, *_ in rank] for rank in records]
    return Session(slices, steps)


def rank_steps(side: str, returncode: int | None, out: Path, nproc: int) -> tuple[list[list[tuple]], str | None]:
    """A finished job's step records, one list per rank (the rank<N>.json files its ranks wrote in ``out``), or
    why there are none: a non-zero exit or a missing rank file (the job's log is ``out``/output.log)."""
    ranks = sorted(out.glob("rank*.json"))
    if returncode != 0 or len(ranks) != nproc:
        return [], f"{side}: exit {returncode}, {len(ranks)} rank files; see {out / 'output.log'}"
    return [[tuple(s) for s in json.loads(p.read_text())["steps"]] for p in ranks], None


def measure(workload: str, sessions: int, args, root: Path, cwd: Path, command, environment,
            progress) -> dict[str, Any]:
    """``sessions`` interleaved pairs of jobs; returns the paired slice ratios and their summary."""
    ratios: list[float] = []
    per_side: dict[str, list[float]] = {"A": [], "B": []}
    errors = []
    for session in range(sessions):
        s = run_session(workload, session, args, root, cwd, command, environment)
        if s.error:
            errors.append(s.error)
            progress(f"[{workload} interleaved {session + 1}/{sessions}] failed: {s.error}")
            continue
        medians = slice_medians(s.slices, s.steps)
        got = paired_slice_ratios(medians)
        ratios += got
        for side, m in medians:
            per_side[side].append(m)
        progress(f"[{workload} interleaved {session + 1}/{sessions}] {len(s.slices)} slices, "
                 f"{len(got)} pairs, B/A median {median(got):.3f}")
    return {"sessions": sessions, "ratios": ratios, "ratio": spread(ratios), "ci95": median_interval(ratios),
            "A_ms": 1e3 * median(per_side["A"]) if per_side["A"] else float("nan"),
            "B_ms": 1e3 * median(per_side["B"]) if per_side["B"] else float("nan"), "errors": errors,
            "slice_s": args.slice or SLICE_S[workload], "epochs": EPOCHS[workload]}
