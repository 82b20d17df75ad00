#!/usr/bin/env python
"""What ``mgpu sweep`` adds per trial: a sweep of N quickstart trials one at a time against the same N trials
launched by hand one after another, alternated.

Each round runs both sides, each in a fresh empty directory (AB, then BA, ...):
  by hand: mgpu launch --cpu --nproc 1 quickstart trainer.epochs=E optim.lr=V run_dir=t<i>   (for each V, in turn)
  sweep:   mgpu sweep --cpu --nproc-per-run 1 --parallel 1 quickstart trainer.epochs=E optim.lr=V1,V2,...
Both must exit 0 with every trial's ``last.pt`` written. Two figures, each the median over rounds with its 95%
interval: the sweep's start (from its command to its first trial's launch, in ``sweep.json``: composing and checking
every trial's recipe, torch imported for that, once a sweep), and what it adds per trial beyond that,
(sweep - start - by hand) / N, against the target: under a second. The whole difference per trial is shown too.

    python benchmarks/sweep_overhead.py              # 6 rounds of 3 trials: ~4 min on 2 cores
    python benchmarks/sweep_overhead.py --rounds 2   # a smoke run (no interval)
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from benchmarks import jobs  # noqa: E402
from benchmarks.overhead import _fmt_interval, verdict  # noqa: E402
from benchmarks.refusal import mgpu_command  # noqa: E402
from benchmarks.stats import median, round_orders  # noqa: E402
from mgpucli.proctree import run_bounded  # noqa: E402

VALUES = ("0.1", "0.05", "0.01", "0.005", "0.001", "0.0005")
SIDES = {"A": "by hand", "B": "mgpu sweep"}
ROUNDS, TRIALS, EPOCHS = 6, 3, 1
TARGET_S = 1.0  # what the sweep adds per trial, the median over rounds


@dataclass
class Side:
    side: str
    seconds: float
    error: str | None = None  # why the side did not run as a user must see it (None: every trial trained)
    start_s: float | None = None  # the sweep's: from its command to its first trial's launch


def commands(side: str, trials: int, epochs: int, python: str) -> list[list[str]]:
    """The commands one side runs, in order: a launch per trial by hand, or one sweep."""
    mgpu, values = mgpu_command(python), VALUES[:trials]
    common = ["quickstart", f"trainer.epochs={epochs}"]
    if side == "A":
        return [[*mgpu, "launch", "--cpu", "--nproc", "1", *common, f"optim.lr={v}", f"run_dir=t{i}"]
                for i, v in enumerate(values)]
    return [[*mgpu, "sweep", "--cpu", "--nproc-per-run", "1", "--parallel", "1", "--name", "s", *common,
             f"optim.lr={','.join(values)}"]]


def checkpoints(side: str, cwd: Path) -> list[Path]:
    pattern = "t*/checkpoints/last.pt" if side == "A" else "runs/s/*/checkpoints/last.pt"
    return sorted(cwd.glob(pattern))


def run_side(side: str, trials: int, epochs: int, python: str, root: Path, timeout: float) -> Side:
    cwd = Path(tempfile.mkdtemp(dir=root))
    started, began = time.monotonic(), time.time()
    for cmd in commands(side, trials, epochs, python):
        done = run_bounded(cmd, timeout, cwd=str(cwd))
        if done.timed_out or done.returncode != 0:
            said = "timed out" if done.timed_out else f"exit {done.returncode}"
            return Side(side, time.monotonic() - started, f"{SIDES[side]}: {said}\n{done.stderr[-1500:]}")
    seconds = time.monotonic() - started
    found = len(checkpoints(side, cwd))
    error = None if found == trials else f"{SIDES[side]}: {found} of {trials} last.pt written"
    return Side(side, seconds, error, first_launch(cwd) - began if side == "B" and not error else None)


def first_launch(cwd: Path) -> float:
    """When the sweep launched its first trial (``time.time()``), from its record."""
    return min(t["started"] for t in json.loads((cwd / "runs/s/sweep.json").read_text())["trials"])


def summarise(rounds: list[dict[str, Side]], trials: int) -> dict[str, Any]:
    """Each side's seconds and the rounds' per-trial differences (sweep - by hand) / trials, with the verdict."""
    done = [r for r in rounds if not r["A"].error and not r["B"].error]
    whole = [(r["B"].seconds - r["A"].seconds) / trials for r in done]
    per_trial = [(r["B"].seconds - r["B"].start_s - r["A"].seconds) / trials for r in done]
    return {"by_hand_s": [r["A"].seconds for r in done], "sweep_s": [r["B"].seconds for r in done],
            "start_s": [r["B"].start_s for r in done], "whole_per_trial_s": whole, "per_trial_s": per_trial,
            "verdict": verdict(per_trial, TARGET_S) if per_trial else "n/a",
            "errors": [r[s].error for r in rounds for s in "AB" if r[s].error]}


def table(s: dict[str, Any], trials: int) -> list[str]:
    lines = ["| | seconds: median (95% interval) | target | |", "|---|---|---|---|",
             f"| {trials} launches by hand, one after another | {_fmt_interval(s['by_hand_s'], '{:.1f}')} | | |",
             f"| `mgpu sweep --parallel 1` of the same {trials} | {_fmt_interval(s['sweep_s'], '{:.1f}')} | | |",
             f"| the sweep's start: every trial checked, once | {_fmt_interval(s['start_s'], '{:.2f}')} | | |",
             f"| (sweep - by hand) / {trials} | {_fmt_interval(s['whole_per_trial_s'], '{:+.2f}')} | | |",
             f"| (sweep - start - by hand) / {trials}: per trial | {_fmt_interval(s['per_trial_s'], '{:+.2f}')} | "
             f"< {TARGET_S:g} s | {s['verdict']} |"]
    return lines + [f"\n{e}" for e in s["errors"]]


def parse_args(argv: list[str] | None = None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter,
                                epilog=__doc__.split("\n\n", 1)[1])
    p.add_argument("--python", default=sys.executable, help="the interpreter whose mgpu runs both sides")
    p.add_argument("--rounds", type=int, default=ROUNDS, help=f"rounds (default {ROUNDS}); 6 or more give an interval")
    p.add_argument("--trials", type=int, default=TRIALS, choices=range(2, len(VALUES) + 1),
                   help=f"trials a side (default {TRIALS})")
    p.add_argument("--epochs", type=int, default=EPOCHS, help=f"epochs a trial (default {EPOCHS})")
    p.add_argument("--timeout", type=float, default=300, help="seconds one command may take (default 300)")
    p.add_argument("--json", type=Path, default=None, help="also write every figure to this file")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    began = time.time()
    print(f"## sweep overhead: {args.trials} quickstart trials of {args.epochs} epoch(s), CPU, 1 process each, "
          f"Python {platform.python_version()}\n", flush=True)
    rounds = []
    with tempfile.TemporaryDirectory(prefix="mgpu-sweep-bench-") as root:
        for i, order in enumerate(round_orders(args.rounds)):
            rounds.append({side: run_side(side, args.trials, args.epochs, args.python, Path(root), args.timeout)
                           for side in order})
            print(f"[{i + 1}/{args.rounds}] " + "; ".join(
                f"{SIDES[s]} {rounds[-1][s].seconds:.1f} s" + (" (failed)" if rounds[-1][s].error else "")
                for s in order), file=sys.stderr, flush=True)
    s = summarise(rounds, args.trials)
    print("\n".join(table(s, args.trials)) + "\n", flush=True)
    if s["per_trial_s"]:
        print(f"{time.time() - began:.0f} s in all; medians: start {median(s['start_s']):.2f} s, per trial beyond "
              f"it {median(s['per_trial_s']):+.2f} s")
    if args.json:
        args.json.write_text(json.dumps(s | {"runs": [{k: asdict(v) for k, v in r.items()} for r in rounds]},
                                        indent=2))
    return 1 if s["errors"] or s["verdict"] == "MISSED" else 0


if __name__ == "__main__":
    jobs.run_main(main)
