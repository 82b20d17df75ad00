#!/usr/bin/env python
"""mgpu against the hand-written DDP loop it replaces: whole jobs, alternated, on the same workload.

Each round runs both jobs one after the other (AB, then BA, ...):
  hand-written: torchrun --standalone --nproc-per-node N benchmarks/handwritten.py --workload W
  mgpu:         mgpu launch --cpu --nproc N recipes/<W's recipe>.yaml   (or --gpus N)
with the same seed, data order, hyperparameters and OMP_NUM_THREADS. It reports, per workload: the step-time ratio
mgpu / hand-written (the median of the rounds' ratios and its 95% interval), time to first step, peak resident
memory per rank, final weights compared bit for bit; and the start-up of `mgpu --version` and `mgpu --help`.

Step time comes from each job's metrics.jsonl (rank 0's train records, every log_every steps and at each epoch's
end): the time between consecutive records of one epoch over the steps between them, so the first interval
(warm-up), validation and checkpoints between epochs are left out. Time to first step is the first record's time
less its steady steps. Peak memory is each rank's VmHWM, read from /proc while the job runs (benchmarks/jobs.py).
A target is "ok" when its whole 95% interval meets it, "MISSED" when none of it does, else "not resolved".

    python benchmarks/overhead.py                   # CPU, 2 gloo processes, both workloads: ~4-5 min on 2 cores
    python benchmarks/overhead.py --rounds 2 --cli-repeats 3      # a smoke run
    python benchmarks/overhead.py --gpus 2          # CUDA GPUs, nccl
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from itertools import pairwise
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from benchmarks import jobs  # noqa: E402
from benchmarks.stats import median, median_interval, resolved_verdict, round_orders  # noqa: E402

HANDWRITTEN = REPO / "benchmarks" / "handwritten.py"
RECIPES = {"mlp": REPO / "recipes" / "quickstart.yaml", "charlm": REPO / "recipes" / "charlm.yaml",
           "text": REPO / "recipes" / "text-classification.yaml"}
# Epochs per job, both sides: the MLP's recipe (3 epochs of ~1 ms steps) would leave ~130 timed steps a job.
EPOCHS = {"mlp": 10, "charlm": 1, "text": 2}
ROUNDS = {"mlp": 10, "charlm": 6, "text": 6}
STEP_TARGET = {"mlp": 1.03, "charlm": 1.01, "text": 1.02}  # mgpu / hand-written step time, the median over rounds
FIRST_STEP_TARGET_S = 0.3  # mgpu - hand-written under plain torchrun
JOB_TARGET_S = 0.5  # mgpu - hand-written, the whole job (start to exit)
MEMORY_TARGET = 1.05  # mgpu / hand-written, the largest rank's peak RSS
CLI_TARGET_S = 0.3
SIDES = {"A": "hand-written", "B": "mgpu"}


# ------------------------------------------------------------------------------------------------ one job
def _tool(name: str, module: str) -> list[str]:
    """The console script beside this interpreter (what a user types), else ``python -m module``."""
    script = Path(sys.executable).parent / name
    return [str(script)] if script.exists() else [sys.executable, "-m", module]


def command(side: str, workload: str, args, out: Path) -> list[str]:
    epochs = args.epochs or EPOCHS[workload]
    if side == "A":
        return [*_tool("torchrun", "torch.distributed.run"), "--standalone", "--nproc-per-node", str(args.nproc),
                str(HANDWRITTEN), "--workload", workload, "--epochs", str(epochs),
                "--device", "cuda" if args.gpus else "cpu", "--out", str(out)]
    devices = ["--gpus", str(args.nproc)] if args.gpus else ["--cpu", "--nproc", str(args.nproc)]
    return [*_tool("mgpu", "mgpucli"), "launch", *devices, str(RECIPES[workload]), f"run_dir={out / 'run'}",
            f"trainer.epochs={epochs}"]


def environment(args) -> dict[str, str]:
    env = dict(os.environ)
    env["OMP_NUM_THREADS"] = str(args.threads)  # the same intra-op threads on both sides (sums depend on them)
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), *[p for p in [os.environ.get("PYTHONPATH")] if p]])
    return env


@dataclass
class Job:
    side: str
    rc: int | None
    seconds: float
    step_s: float = float("nan")  # mean step time over the timed intervals
    steps: int = 0
    first_step_s: float = float("nan")
    rss_mib: dict[int, float] = field(default_factory=dict)  # rank -> peak RSS
    weights: str | None = None
    error: str | None = None


def step_time(records: list[dict[str, Any]]) -> tuple[int, float]:
    """(steps, seconds) between consecutive train records of the same epoch: steady steps only."""
    train = [r for r in records if r.get("split") == "train"]
    steps, seconds = 0, 0.0
    for a, b in pairwise(train):
        if a["epoch"] == b["epoch"] and b["step"] > a["step"]:
            steps, seconds = steps + b["step"] - a["step"], seconds + b["time"] - a["time"]
    return steps, seconds


def first_step_s(records: list[dict[str, Any]], t0: float, step_s: float) -> float:
    """Seconds from ``t0`` to the end of step 1: the first train record's time less its steps after the first."""
    first = next(r for r in records if r.get("split") == "train")
    return first["time"] - t0 - (first["step"] - 1) * step_s


def run_job(side: str, workload: str, args, out: Path) -> Job:
    out.mkdir(parents=True)
    log = out / "output.log"
    t0 = time.time()
    done = jobs.run(command(side, workload, args, out), environment(args), args.timeout, log, cwd=REPO)
    job = Job(side, done.rc, done.seconds, rss_mib=done.peak_rss_mib)
    metrics = out / ("metrics.jsonl" if side == "A" else "run/metrics.jsonl")
    records = [json.loads(line) for line in metrics.read_text().splitlines()] if metrics.exists() else []
    job.steps, seconds = step_time(records)
    if done.rc != 0 or not job.steps:
        tail = "\n    ".join(log.read_text(errors="replace").splitlines()[-12:])
        job.error = ("timed out" if done.rc is None else f"exit {done.rc}") + f", {job.steps} timed steps:\n    {tail}"
        return job
    job.step_s = seconds / job.steps
    job.first_step_s = first_step_s(records, t0, job.step_s)
    weights = out / ("weights.pt" if side == "A" else "run/checkpoints/last.pt")
    job.weights = str(weights) if weights.exists() else None
    return job


def same_weights(a: str | None, b: str | None) -> bool:
    """The hand-written loop's state dict and the model in mgpu's last.pt: the same keys, every tensor's bytes equal."""
    if not a or not b:
        return False
    import torch

    return bitwise_equal(torch.load(a, weights_only=True), torch.load(b, weights_only=True)["model"])


def bitwise_equal(wa: dict[str, Any], wb: dict[str, Any]) -> bool:
    """Two state dicts with the same keys, every tensor's dtype, shape and bytes equal."""
    import torch

    return wa.keys() == wb.keys() and all(
        wa[k].dtype == wb[k].dtype and wa[k].shape == wb[k].shape
        and torch.equal(wa[k].reshape(-1).view(torch.uint8), wb[k].reshape(-1).view(torch.uint8)) for k in wa)


def alternate_rounds(workload: str, n: int, run_one: Callable[[str, Path], Any], sides: dict[str, str],
                     same: Callable[[str | None, str | None], bool], root: Path) -> tuple[list[dict], list[bool]]:
    """``n`` rounds of both jobs (``run_one(side, out)``), their order alternating; each round said on stderr as it
    ends. Returns the rounds and, for each round where both jobs ran, whether their final weights are equal."""
    rounds, equal = [], []
    for i, order in enumerate(round_orders(n)):
        rnd = {side: run_one(side, root / workload / f"{i:02d}{side}") for side in order}
        rounds.append(rnd)
        if not rnd["A"].error and not rnd["B"].error:
            equal.append(same(rnd["A"].weights, rnd["B"].weights))
        print(f"[{workload} {i + 1}/{n}] " + "; ".join(
            f"{sides[s]} " + (rnd[s].error.splitlines()[0] if rnd[s].error else
                              f"{1e3 * rnd[s].step_s:.3f} ms/step, {rnd[s].seconds:.1f} s")
            for s in order), file=sys.stderr, flush=True)
    return rounds, equal


def recipe_drift(workload: str) -> list[str]:
    """Where the hand-written loop's constants no longer match the shipped recipe (both sides must train alike)."""
    from omegaconf import OmegaConf

    from benchmarks.handwritten import WORKLOADS

    w, cfg = WORKLOADS[workload], OmegaConf.load(RECIPES[workload])
    want = {"seed": w["seed"], "data.batch_size": w["batch_size"], "trainer.epochs": w["epochs"], "optim.lr": w["lr"],
            "trainer.clip_grad_norm": w["clip_grad_norm"], "trainer.log_every": w["log_every"]}
    want |= {"mlp": {"optim.momentum": w.get("momentum")},
             "charlm": {"optim.weight_decay": w.get("weight_decay"), "vars.block_size": w.get("block_size")},
             "text": {"optim.weight_decay": w.get("weight_decay"), "data.train.max_length": w.get("max_length")},
             }[workload]
    return [f"{key}: recipe {got!r}, hand-written {value!r}" for key, value in want.items()
            if (got := OmegaConf.select(cfg, key, default=None)) != value]


# ------------------------------------------------------------------------------------------------ summaries
def _fmt_interval(values: list[float], fmt: str) -> str:
    """The median of per-round values and its 95% interval (6 rounds or more: fewer cannot give one)."""
    if not values:
        return "-"
    ci = median_interval(values)
    return fmt.format(median(values)) + (f" ({fmt.format(ci.low)} to {fmt.format(ci.high)})" if ci.coverage >= 0.95
                                         else f" ({len(values)} rounds: no interval)")


def verdict(values: list[float], limit: float) -> str:
    """``ok``/``MISSED``/``not resolved`` by the 95% interval of the median; none with too few values for one."""
    ci = median_interval(values)
    return resolved_verdict(ci, limit) if ci.coverage >= 0.95 else "too few rounds"


def summarise(rounds: list[dict[str, Job]], weights_equal: list[bool], target: float) -> dict[str, Any]:
    """Per-round ratios and differences of complete rounds, their medians, 95% intervals and verdicts."""
    done = [r for r in rounds if not r["A"].error and not r["B"].error]
    step = [r["B"].step_s / r["A"].step_s for r in done]
    first = [r["B"].first_step_s - r["A"].first_step_s for r in done]
    whole = [r["B"].seconds - r["A"].seconds for r in done]
    rss = [max(r["B"].rss_mib.values()) / max(r["A"].rss_mib.values())
           for r in done if r["A"].rss_mib and r["B"].rss_mib]
    ranks = sorted({k for r in done for side in "AB" for k in r[side].rss_mib})

    def side(name: str) -> dict[str, Any]:
        return {"step_ms": 1e3 * median([r[name].step_s for r in done]),
                "first_step_s": median([r[name].first_step_s for r in done]),
                "rss_mib": {k: median([r[name].rss_mib[k] for r in done if k in r[name].rss_mib]) for k in ranks},
                "job_s": median([r[name].seconds for r in done])}

    return {"rounds": len(rounds), "complete": len(done), "A": side("A"), "B": side("B"),
            "step_ratio": step, "step_verdict": verdict(step, target), "step_target": target,
            "first_step_diff_s": first, "first_step_verdict": verdict(first, FIRST_STEP_TARGET_S),
            "job_diff_s": whole, "job_verdict": verdict(whole, JOB_TARGET_S),
            "rss_ratio": rss, "rss_verdict": verdict(rss, MEMORY_TARGET),
            "weights_equal": sum(weights_equal), "weights_verdict": "ok" if done and all(weights_equal) else "MISSED",
            "errors": [f"round {i + 1} {SIDES[s]}: {r[s].error}" for i, r in enumerate(rounds) for s in "AB"
                       if r[s].error]}


def table(workload: str, s: dict[str, Any], epochs: int) -> list[str]:
    a, b = s["A"], s["B"]
    rss = " / ".join(f"{v:.0f}" for v in a["rss_mib"].values()), " / ".join(f"{v:.0f}" for v in b["rss_mib"].values())
    lines = [f"### {workload} ({RECIPES[workload].name}, {epochs} epoch(s) a job, {s['complete']} of {s['rounds']} "
             "rounds complete)", "",
             "| | hand-written | mgpu | mgpu vs hand-written: median (95% interval) | target | |",
             "|---|---|---|---|---|---|",
             f"| step time | {a['step_ms']:.3f} ms | {b['step_ms']:.3f} ms | "
             f"{_fmt_interval(s['step_ratio'], '{:.3f}')} | <= {s['step_target']:.2f} | {s['step_verdict']} |",
             f"| time to first step | {a['first_step_s']:.2f} s | {b['first_step_s']:.2f} s | "
             f"{_fmt_interval(s['first_step_diff_s'], '{:+.2f}')} s | <= +{FIRST_STEP_TARGET_S} s | "
             f"{s['first_step_verdict']} |",
             f"| peak RSS per rank (MiB, rank 0 / 1 / ...) | {rss[0]} | {rss[1]} | "
             f"{_fmt_interval(s['rss_ratio'], '{:.3f}')} (largest rank) | <= {MEMORY_TARGET:.2f} | "
             f"{s['rss_verdict']} |",
             f"| final weights bitwise equal | | | {s['weights_equal']} of {s['complete']} rounds | all | "
             f"{s['weights_verdict']} |",
             f"| whole job | {a['job_s']:.2f} s | {b['job_s']:.2f} s | {_fmt_interval(s['job_diff_s'], '{:+.2f}')} s | "
             f"<= +{JOB_TARGET_S} s | {s['job_verdict']} |"]
    return lines + [f"\n{e}" for e in s["errors"]]


# ------------------------------------------------------------------------------------------------ CLI start-up
def cli_startup(repeats: int, timeout: float) -> dict[str, list[float]]:
    """Wall seconds of each command, ``repeats`` times, interleaved (none of them starts a process of its own)."""
    commands = {"mgpu --version": [*_tool("mgpu", "mgpucli"), "--version"],
                "mgpu --help": [*_tool("mgpu", "mgpucli"), "--help"],
                "python -c pass (reference)": [sys.executable, "-c", "pass"]}
    seconds: dict[str, list[float]] = {name: [] for name in commands}
    for _ in range(repeats):
        for name, cmd in commands.items():
            t0 = time.perf_counter()
            done = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL)
            seconds[name].append(time.perf_counter() - t0)
            if done.returncode != 0:
                raise RuntimeError(f"`{name}` exited {done.returncode}: {(done.stdout + done.stderr)[-2000:]}")
    return seconds


def cli_table(seconds: dict[str, list[float]]) -> list[str]:
    lines = ["### CLI start-up", "", "| command | median (95% interval) | target | |", "|---|---|---|---|"]
    for name, values in seconds.items():
        mgpu = name.startswith("mgpu")
        lines.append(f"| `{name}` | {_fmt_interval(values, '{:.3f}')} s | {f'< {CLI_TARGET_S} s' if mgpu else ''} | "
                     f"{verdict(values, CLI_TARGET_S) if mgpu else ''} |")
    return lines


# ------------------------------------------------------------------------------------------------ main
def parse_args(argv: list[str] | None = None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter,
                                epilog=__doc__.split("\n\n", 1)[1])
    dev = p.add_mutually_exclusive_group()
    dev.add_argument("--cpu", action="store_true", help="CPU processes with gloo (the default)")
    dev.add_argument("--gpus", type=int, default=None, metavar="N", help="N CUDA GPUs with nccl, one process each")
    p.add_argument("--nproc", type=int, default=2, help="processes with --cpu (default 2)")
    p.add_argument("--workload", choices=[*RECIPES, "all"], default="all")
    p.add_argument("--rounds", type=int, default=None,
                   help=f"rounds of both jobs (default: {', '.join(f'{w} {n}' for w, n in ROUNDS.items())}); "
                        "6 or more give a 95%% interval")
    p.add_argument("--epochs", type=int, default=None,
                   help=f"epochs a job, both sides (default: {', '.join(f'{w} {n}' for w, n in EPOCHS.items())})")
    p.add_argument("--cli-repeats", type=int, default=10, help="runs of each CLI command (default 10; 0: skip)")
    p.add_argument("--timeout", type=float, default=300, help="seconds one job may take (default 300)")
    p.add_argument("--json", type=Path, default=None, help="also write every figure to this file")
    p.add_argument("--keep", action="store_true", help="keep the jobs' folders (logs, metrics, weights)")
    args = p.parse_args(argv)
    if args.gpus is not None:
        args.nproc = args.gpus
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    args.threads = max(1, cores // args.nproc)
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    import torch

    if args.gpus and torch.cuda.device_count() < args.gpus:
        print(f"overhead.py --gpus {args.gpus}: skipped, {torch.cuda.device_count()} CUDA GPU(s) visible.")
        return 0
    started = time.time()
    device = (f"{args.gpus} x {torch.cuda.get_device_name(0)} (nccl)" if args.gpus
              else f"{args.nproc} CPU processes (gloo)")
    results: dict[str, Any] = {"argv": sys.argv[1:] if argv is None else argv, "device": device,
                               "torch": torch.__version__, "python": platform.python_version(), "workloads": {}}
    print(f"## mgpu overhead: {device}, {args.threads} thread(s) each, {os.cpu_count()} cores; "
          f"torch {torch.__version__}, Python {platform.python_version()}\n", flush=True)
    failed = False
    root = Path(tempfile.mkdtemp(prefix="mgpu-bench-"))
    try:
        if args.cli_repeats:
            results["cli"] = cli_startup(args.cli_repeats, 60)
            print("\n".join(cli_table(results["cli"])) + "\n", flush=True)
        for workload in list(RECIPES) if args.workload == "all" else [args.workload]:
            for line in recipe_drift(workload):
                print(f"warning: {workload}: {line}", file=sys.stderr)
            rounds, equal = alternate_rounds(
                workload, ROUNDS[workload] if args.rounds is None else args.rounds,
                lambda side, out, w=workload: run_job(side, w, args, out), SIDES, same_weights, root)
            s = summarise(rounds, equal, STEP_TARGET[workload])
            results["workloads"][workload] = s | {"jobs": [{k: asdict(v) for k, v in r.items()} for r in rounds]}
            print("\n".join(table(workload, s, args.epochs or EPOCHS[workload])) + "\n", flush=True)
            failed |= bool(s["errors"]) or "MISSED" in (s["step_verdict"], s["first_step_verdict"], s["job_verdict"],
                                                       s["rss_verdict"], s["weights_verdict"])
    finally:
        if args.keep:
            print(f"jobs kept in {root}", file=sys.stderr)
        else:
            shutil.rmtree(root, ignore_errors=True)
    print(f"{time.time() - started:.0f} s in all; command: python benchmarks/overhead.py "
          + " ".join(sys.argv[1:] if argv is None else argv))
    if args.json:
        args.json.write_text(json.dumps(results, indent=1, default=str))
    return 1 if failed else 0


if __name__ == "__main__":
    jobs.run_main(main)
