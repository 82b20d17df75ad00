#!/usr/bin/env python
"""What ``mgpu launch --audit`` costs: the hand-written DDP loop launched as a script, with and without the audit.

Each round runs both jobs one after the other (AB, then BA, ...):
  without: mgpu launch --cpu --nproc N benchmarks/handwritten.py --workload W --out DIR
  with:    mgpu launch --cpu --nproc N --audit benchmarks/handwritten.py --workload W --out DIR
(or --gpus N and --device cuda). It reports, per workload: the step-time ratio with / without (the median of the
rounds' ratios and its 95% interval), time to first step, the final weights compared bit for bit (the audit must not
change them), and the audit's findings, of which a correct loop must have none. Step time and time to first step
are read from the loop's metrics.jsonl as in overhead.py.

    python benchmarks/audit_overhead.py                    # CPU, 2 gloo processes, both workloads: ~3 min on 2 cores
    python benchmarks/audit_overhead.py --rounds 2         # a smoke run
    python benchmarks/audit_overhead.py --gpus 2           # CUDA GPUs, nccl
"""

from __future__ import annotations

import argparse
import json
import platform
import shutil
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
from benchmarks.overhead import (  # noqa: E402
    HANDWRITTEN,
    _fmt_interval,
    _tool,
    alternate_rounds,
    bitwise_equal,
    environment,
    first_step_s,
    step_time,
    verdict,
)
from benchmarks.overhead import parse_args as overhead_args  # noqa: E402
from benchmarks.stats import median  # noqa: E402

EPOCHS = {"mlp": 10, "charlm": 1}
ROUNDS = {"mlp": 8, "charlm": 6}
STEP_TARGET = {"mlp": 1.02, "charlm": 1.01}  # with / without, the median over rounds
FIRST_STEP_TARGET_S = 0.2  # with - without
SIDES = {"A": "without --audit", "B": "with --audit"}


@dataclass
class Job:
    side: str
    rc: int | None
    seconds: float
    step_s: float = float("nan")
    steps: int = 0
    first_step_s: float = float("nan")
    weights: str | None = None
    findings: list[str] | None = None  # the audit's kinds of finding (None: not audited)
    error: str | None = None


def command(side: str, workload: str, args, out: Path) -> list[str]:
    devices = ["--gpus", str(args.nproc)] if args.gpus else ["--cpu", "--nproc", str(args.nproc)]
    audit = ["--audit"] if side == "B" else []
    return [*_tool("mgpu", "mgpucli"), "launch", *devices, *audit, "--run-dir", str(out / "run"), str(HANDWRITTEN),
            "--workload", workload, "--epochs", str(args.epochs or EPOCHS[workload]),
            "--device", "cuda" if args.gpus else "cpu", "--out", str(out)]


def run_job(side: str, workload: str, args, out: Path) -> Job:
    out.mkdir(parents=True)
    log = out / "output.log"
    t0 = time.time()
    done = jobs.run(command(side, workload, args, out), environment(args), args.timeout, log, cwd=REPO)
    job = Job(side, done.rc, done.seconds)
    metrics = out / "metrics.jsonl"
    records = [json.loads(line) for line in metrics.read_text().splitlines()] if metrics.exists() else []
    job.steps, seconds = step_time(records)
    audit = out / "run" / "audit.json"
    if side == "B":
        job.findings = ([g["kind"] for g in json.loads(audit.read_text())["summary"]] if audit.exists()
                        else ["(no audit.json)"])
    if done.rc != 0 or not job.steps:
        tail = "\n    ".join(log.read_text(errors="replace").splitlines()[-12:])
        job.error = ("timed out" if done.rc is None else f"exit {done.rc}") + f", {job.steps} timed steps:\n    {tail}"
        return job
    job.step_s = seconds / job.steps
    job.first_step_s = first_step_s(records, t0, job.step_s)
    weights = out / "weights.pt"
    job.weights = str(weights) if weights.exists() else None
    return job


def same_weights(a: str | None, b: str | None) -> bool:
    """Two state dicts: the same keys, every tensor's bytes equal."""
    if not a or not b:
        return False
    import torch

    return bitwise_equal(torch.load(a, weights_only=True), torch.load(b, weights_only=True))


def summarise(rounds: list[dict[str, Job]], equal: list[bool], target: float) -> dict[str, Any]:
    done = [r for r in rounds if not r["A"].error and not r["B"].error]
    step = [r["B"].step_s / r["A"].step_s for r in done]
    first = [r["B"].first_step_s - r["A"].first_step_s for r in done]
    findings = sorted({kind for r in rounds for kind in r["B"].findings or []})
    return {"rounds": len(rounds), "complete": len(done),
            "step_ms": {s: median([1e3 * r[s].step_s for r in done]) if done else float("nan") for s in "AB"},
            "step_ratio": step, "step_verdict": verdict(step, target), "step_target": target,
            "first_step_diff_s": first, "first_step_verdict": verdict(first, FIRST_STEP_TARGET_S),
            "weights_equal": sum(equal), "weights_verdict": "ok" if done and all(equal) else "MISSED",
            "findings": findings, "findings_verdict": "ok" if not findings else "MISSED",
            "errors": [f"round {i + 1} {SIDES[s]}: {r[s].error}" for i, r in enumerate(rounds) for s in "AB"
                       if r[s].error]}


def table(workload: str, s: dict[str, Any], epochs: int) -> list[str]:
    ms = s["step_ms"]
    lines = [f"### {workload} (benchmarks/handwritten.py, {epochs} epoch(s) a job, {s['complete']} of {s['rounds']} "
             "rounds complete)", "",
             "| | without | with --audit | with / without: median (95% interval) | target | |",
             "|---|---|---|---|---|---|",
             f"| step time | {ms['A']:.3f} ms | {ms['B']:.3f} ms | {_fmt_interval(s['step_ratio'], '{:.3f}')} | "
             f"<= {s['step_target']:.2f} | {s['step_verdict']} |",
             f"| time to first step | | | {_fmt_interval(s['first_step_diff_s'], '{:+.2f}')} s | "
             f"<= +{FIRST_STEP_TARGET_S} s | {s['first_step_verdict']} |",
             f"| final weights bitwise equal | | | {s['weights_equal']} of {s['complete']} rounds | all | "
             f"{s['weights_verdict']} |",
             f"| findings (a correct loop) | | | {', '.join(s['findings']) or 'none'} | none | "
             f"{s['findings_verdict']} |"]
    return lines + [f"\n{e}" for e in s["errors"]]


def parse_args(argv: list[str] | None = None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter,
                                epilog=__doc__.split("\n\n", 1)[1])
    dev = p.add_mutually_exclusive_group()
    dev.add_argument("--cpu", action="store_true", help="CPU processes with gloo (the default)")
    dev.add_argument("--gpus", type=int, default=None, metavar="N", help="N CUDA GPUs with nccl, one process each")
    p.add_argument("--nproc", type=int, default=2, help="processes with --cpu (default 2)")
    p.add_argument("--workload", choices=["mlp", "charlm", "all"], default="all")
    p.add_argument("--rounds", type=int, default=None,
                   help=f"rounds of both jobs (default: mlp {ROUNDS['mlp']}, charlm {ROUNDS['charlm']})")
    p.add_argument("--epochs", type=int, default=None,
                   help=f"epochs a job (default: mlp {EPOCHS['mlp']}, charlm {EPOCHS['charlm']})")
    p.add_argument("--timeout", type=float, default=300, help="seconds one job may take (default 300)")
    p.add_argument("--json", type=Path, default=None, help="also write every figure to this file")
    p.add_argument("--keep", action="store_true", help="keep the jobs' folders")
    args = p.parse_args(argv)
    args.nproc = args.gpus if args.gpus is not None else args.nproc
    args.threads = overhead_args(["--nproc", str(args.nproc)]).threads
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    import torch

    if args.gpus and torch.cuda.device_count() < args.gpus:
        print(f"audit_overhead.py --gpus {args.gpus}: skipped, {torch.cuda.device_count()} CUDA GPU(s) visible.")
        return 0
    started = time.time()
    device = (f"{args.gpus} x {torch.cuda.get_device_name(0)} (nccl)" if args.gpus
              else f"{args.nproc} CPU processes (gloo)")
    print(f"## mgpu launch --audit overhead: {device}, {args.threads} thread(s) each; torch {torch.__version__}, "
          f"Python {platform.python_version()}\n", flush=True)
    results: dict[str, Any] = {"device": device, "workloads": {}}
    failed = False
    root = Path(tempfile.mkdtemp(prefix="mgpu-audit-bench-"))
    try:
        for workload in ["mlp", "charlm"] if args.workload == "all" else [args.workload]:
            rounds, equal = alternate_rounds(
                workload, ROUNDS[workload] if args.rounds is None else args.rounds,
                lambda side, out, w=workload: run_job(side, w, args, out), SIDES, same_weights, root)
            s = summarise(rounds, equal, STEP_TARGET[workload])
            results["workloads"][workload] = s | {"jobs": [{k: asdict(v) for k, v in r.items()} for r in rounds]}
            print("\n".join(table(workload, s, args.epochs or EPOCHS[workload])) + "\n", flush=True)
            failed |= bool(s["errors"]) or "MISSED" in (s["step_verdict"], s["first_step_verdict"],
                                                       s["weights_verdict"], s["findings_verdict"])
    finally:
        if args.keep:
            print(f"jobs kept in {root}", file=sys.stderr)
        else:
            shutil.rmtree(root, ignore_errors=True)
    print(f"{time.time() - started:.0f} s in all; command: python benchmarks/audit_overhead.py "
          + " ".join(sys.argv[1:] if argv is None else argv))
    if args.json:
        args.json.write_text(json.dumps(results, indent=1, default=str))
    return 1 if failed else 0


if __name__ == "__main__":
    jobs.run_main(main)
