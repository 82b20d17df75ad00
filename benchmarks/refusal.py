#!/usr/bin/env python
"""How fast a typo is refused: ``mgpu launch`` against ``mgpu train`` refusing the same recipe, alternated.

Each round runs both commands, each in a fresh empty directory, one after the other (AB, then BA, ...):
  train:   mgpu train quickstart TYPO
  launch:  mgpu launch --cpu --nproc 2 quickstart TYPO
for two typos: ``optim.lrr=0.1`` (a target's argument: refused once torch's optimizer is imported, did you mean
``lr``) and ``trainer.epochz=3`` (the recipe's schema: refused without torch, did you mean ``trainer.epochs``). Both
commands must exit 2 with the same did-you-mean and leave the directory empty. It reports each command's wall time
(median and 95% interval) and the median of the rounds' differences launch - train, against its target.

``--python PATH`` runs both with another interpreter (say a venv with the CUDA build of torch, whose import is the
slowest): the figures are those of that build.

    python benchmarks/refusal.py                                  # 8 rounds a typo: ~1 min on 2 cores
    python benchmarks/refusal.py --python /tmp/venv214/bin/python # another build of torch
    python benchmarks/refusal.py --rounds 2                       # a smoke run (no intervals)
"""

from __future__ import annotations

import argparse
import json
import platform
import subprocess
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
from benchmarks.stats import median, round_orders  # noqa: E402
from mgpucli.proctree import run_bounded  # noqa: E402

# typo -> (the override, what both commands must say)
TYPOS = {
    "target": ("optim.lrr=0.1", "optim.lrr: torch.optim.SGD takes no argument 'lrr' (did you mean 'lr'?)"),
    "schema": ("trainer.epochz=3", "trainer.epochz: unknown key (did you mean 'trainer.epochs'?)"),
}
SIDES = {"A": "mgpu train", "B": "mgpu launch"}
ROUNDS = 8
TARGET_S = 0.3  # launch - train, the median over rounds: "about as fast"


@dataclass
class Refusal:
    side: str
    seconds: float
    error: str | None = None  # why this run is no refusal as a user must see it (None: it is one)


def mgpu_command(python: str) -> list[str]:
    """``mgpu`` beside ``python`` (the console script a user types), else ``python -m mgpucli``."""
    script = Path(python).parent / "mgpu"
    return [str(script)] if script.exists() else [python, "-m", "mgpucli"]


def command(side: str, override: str, python: str) -> list[str]:
    if side == "A":
        return [*mgpu_command(python), "train", "quickstart", override]
    return [*mgpu_command(python), "launch", "--cpu", "--nproc", "2", "quickstart", override]


def refused(side: str, seconds: float, code: int | None, stderr: str, said: str, left: list[str]) -> Refusal:
    """One run judged: exit 2, the did-you-mean said, nothing left in its directory, no traceback."""
    problem = None
    if code != 2:
        problem = "timed out" if code is None else f"exit {code}"
    elif said not in stderr or "Traceback" in stderr:
        problem = "not the refusal expected"
    elif left:
        problem = f"left {', '.join(left)}"
    return Refusal(side, seconds, f"{SIDES[side]}: {problem}\n{stderr[-1500:]}" if problem else None)


def run_one(side: str, typo: str, python: str, root: Path, timeout: float) -> Refusal:
    override, said = TYPOS[typo]
    cwd = Path(tempfile.mkdtemp(dir=root))
    done = run_bounded(command(side, override, python), timeout, cwd=str(cwd))
    code = None if done.timed_out else done.returncode
    return refused(side, done.seconds, code, done.stderr, said, sorted(p.name for p in cwd.iterdir()))


def summarise(rounds: list[dict[str, Refusal]]) -> dict[str, Any]:
    """Each side's seconds and the rounds' differences launch - train (complete rounds only), with the verdict."""
    done = [r for r in rounds if not r["A"].error and not r["B"].error]
    diffs = [r["B"].seconds - r["A"].seconds for r in done]
    return {"train_s": [r["A"].seconds for r in done], "launch_s": [r["B"].seconds for r in done],
            "diff_s": diffs, "verdict": verdict(diffs, TARGET_S) if diffs else "n/a",
            "errors": [r[s].error for r in rounds for s in "AB" if r[s].error]}


def table(typo: str, s: dict[str, Any]) -> list[str]:
    override = TYPOS[typo][0]
    lines = [f"### `{override}` ({typo})", "", "| | seconds: median (95% interval) | target | |", "|---|---|---|---|",
             f"| `mgpu train quickstart {override}` | {_fmt_interval(s['train_s'], '{:.2f}')} | | |",
             f"| `mgpu launch --cpu --nproc 2 quickstart {override}` | {_fmt_interval(s['launch_s'], '{:.2f}')} | | |",
             f"| launch - train | {_fmt_interval(s['diff_s'], '{:+.2f}')} | <= +{TARGET_S} s | {s['verdict']} |"]
    return lines + [f"\n{e}" for e in s["errors"]]


def parse_args(argv: list[str] | None = None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter,
                                epilog=__doc__.split("\n\n", 1)[1])
    p.add_argument("--python", default=sys.executable, help="the interpreter whose mgpu and torch run both commands "
                   "(default: this one)")
    p.add_argument("--rounds", type=int, default=ROUNDS, help=f"rounds a typo (default {ROUNDS}); 6 or more give a "
                   "95%% interval")
    p.add_argument("--timeout", type=float, default=120, help="seconds one command may take (default 120)")
    p.add_argument("--json", type=Path, default=None, help="also write every figure to this file")
    return p.parse_args(argv)


def _torch_version(python: str) -> str:
    done = subprocess.run([python, "-c", "import torch; print(torch.__version__)"], capture_output=True, text=True,
                          timeout=120, stdin=subprocess.DEVNULL)
    return done.stdout.strip() or f"(torch does not import: {done.stderr.strip()[-200:]})"


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    started = time.time()
    torch_version = _torch_version(args.python)
    results: dict[str, Any] = {"python": args.python, "torch": torch_version, "typos": {}}
    print(f"## refusal time: torch {torch_version}, Python {platform.python_version()} ({args.python})\n", flush=True)
    failed = False
    with tempfile.TemporaryDirectory(prefix="mgpu-refusal-") as root:
        for typo in TYPOS:
            rounds = []
            for i, order in enumerate(round_orders(args.rounds)):
                rounds.append({side: run_one(side, typo, args.python, Path(root), args.timeout) for side in order})
                print(f"[{typo} {i + 1}/{args.rounds}] " + "; ".join(
                    f"{SIDES[s]} {rounds[-1][s].seconds:.2f} s" + (" (no refusal)" if rounds[-1][s].error else "")
                    for s in order), file=sys.stderr, flush=True)
            s = summarise(rounds)
            results["typos"][typo] = s | {"runs": [{k: asdict(v) for k, v in r.items()} for r in rounds]}
            print("\n".join(table(typo, s)) + "\n", flush=True)
            failed |= bool(s["errors"]) or s["verdict"] == "MISSED"
    print(f"{time.time() - started:.0f} s in all; medians: " + ", ".join(
        f"{typo} train {median(s['train_s']):.2f} s, launch {median(s['launch_s']):.2f} s"
        for typo, s in results["typos"].items() if s["diff_s"]))
    if args.json:
        args.json.write_text(json.dumps(results, indent=2))
    return 1 if failed else 0


if __name__ == "__main__":
    jobs.run_main(main)
