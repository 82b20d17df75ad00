#!/usr/bin/env python
"""mgpu against the hand-written DDP loop, side by side in one invocation: step time, CPU time, time to first
step, peak memory and final weights; plus ``mgpu --help``/``--version`` start-up and a hot-path audit.

(A) ``torchrun --standalone --nproc-per-node N benchmarks/handwritten.py --workload W``: the tutorial loop.
(B) ``mgpu launch --cpu --nproc N recipes/<W's recipe>.yaml run_dir=<tmp>``: mgpu, unchanged. A probe
    (benchmarks/probe/sitecustomize.py, on PYTHONPATH for B only) takes the same per-step record inside
    mgpu's Trainer that the hand-written loop takes inline.

Rounds are interleaved AB, BA, AB, ... ; every figure is a per-round value, summarised as median, IQR and range
over rounds, with the 95% interval of that median, and the ratios are paired (B/A within a round). Steps are
timed after a warm-up, between two consecutive steps of one epoch (validation and checkpoints between epochs are
not steps). A target is "ok" only when the whole interval meets it. On the CPU each workload is then measured
once more with both loops in the same processes (benchmarks/inprocess.py, ``--same-process N`` step pairs): on a
shared machine whose speed drifts by tens of percent between runs, that is the comparison that resolves a
step-time ratio of a few percent, and its ratio of mean step times carries a verdict too. With ``--interleaved N``,
also N time-sliced sessions per workload (benchmarks/interleaved.py, a diagnostic): both jobs run at once and take
turns every fraction of a second, so that their steps are compared on the same seconds of the machine.
With ``--cores N``, also N rounds of both whole jobs at once, each confined to a core of its own (benchmarks/cores.py,
a diagnostic): whole processes compared on the same seconds of the machine, with the same thread placement.

    python benchmarks/overhead.py                      # CPU, 2 gloo processes, both workloads, CLI start-up
    python benchmarks/overhead.py --workload mlp --rounds 12
    python benchmarks/overhead.py --workload mlp --rounds 0 --no-audit --interleaved 5   # time-sliced only
    python benchmarks/overhead.py --gpus 2             # where CUDA exists (nccl)
    python benchmarks/overhead.py --json results.json  # every figure, machine-readable
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
from dataclasses import asdict, dataclass, field
from itertools import pairwise
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from benchmarks.children import end_tree, exit_on_sigterm  # noqa: E402
from benchmarks.stats import (  # noqa: E402
    Interval,
    Spread,
    median,
    median_interval,
    paired_ratios,
    quantile,
    resolved_verdict,
    round_orders,
    spread,
    step_intervals,
    window,
)
from mgpucli.cpus import available_cores, threads_per_process  # noqa: E402

PROBE = REPO / "benchmarks" / "probe"
HANDWRITTEN = REPO / "benchmarks" / "handwritten.py"
RECIPES = {"mlp": REPO / "recipes" / "quickstart.yaml", "charlm": REPO / "recipes" / "charlm.yaml"}
STEP_TARGET = {"mlp": 1.03, "charlm": 1.01}
FIRST_STEP_TARGET_S = 0.5
MEMORY_TARGET = 1.05
CLI_TARGET_S = 0.3
DEFAULT_ROUNDS = {"mlp": 20, "charlm": 10}  # the MLP's ~1.5 ms steps vary most from run to run
# Step pairs of benchmarks/inprocess.py (both loops in the same processes, taking turns step by step; the steps
# of 3000 and 100 log intervals per side): ~5 min for the MLP, ~4 min for the char LM here.
SAME_PROCESS_ROUNDS = {"mlp": 60000, "charlm": 2000}
# Epochs per run, the same on both sides. The MLP's steps are ~1 ms: 10 epochs give each run 640 steps per rank
# (the recipe's 3 would leave ~170 after the warm-up); the char LM keeps its recipe's 2 (176 steps, ~40 ms each).
DEFAULT_EPOCHS = {"mlp": 10, "charlm": None}


# ------------------------------------------------------------------------------------------------ commands
def _tool(name: str, module: str) -> list[str]:
    """The console script beside this interpreter (what a user types), else ``python -m module``."""
    script = Path(sys.executable).parent / name
    return [str(script)] if script.exists() else [sys.executable, "-m", module]


def command(side: str, workload: str, args, out: Path) -> list[str]:
    epochs = args.epochs if args.epochs is not None else DEFAULT_EPOCHS[workload]
    if side == "A":
        cmd = [*_tool("torchrun", "torch.distributed.run"), "--standalone", "--nproc-per-node", str(args.nproc),
               str(HANDWRITTEN), "--workload", workload]
        return cmd + (["--epochs", str(epochs)] if epochs else [])
    devices = ["--gpus", str(args.nproc)] if args.gpus else ["--cpu", "--nproc", str(args.nproc)]
    cmd = [*_tool("mgpu", "mgpucli"), "launch", *devices, str(RECIPES[workload]), f"run_dir={out / 'run'}"]
    return cmd + ([f"trainer.epochs={epochs}"] if epochs else []) + list(args.mgpu_override)


def environment(side: str, args, out: Path, audit: bool = False) -> dict[str, str]:
    env = dict(os.environ)
    env["OMP_NUM_THREADS"] = str(args.threads)  # the same intra-op thread count on both sides (sums depend on it)
    env["MGPU_BENCH_OUT"] = str(out)
    env["MGPU_BENCH_DEVICE"] = "cuda" if args.gpus else "cpu"
    path = [str(PROBE), str(REPO)] if side == "B" else [str(REPO)]
    env["PYTHONPATH"] = os.pathsep.join(path + [p for p in [os.environ.get("PYTHONPATH")] if p])
    if audit:
        env["MGPU_BENCH_AUDIT"] = "1"
    if args.pin:
        env["MGPU_BENCH_PIN"] = "1"
    if side == "B" and args.experiment:
        env["MGPU_BENCH_EXPERIMENT"] = args.experiment
    return env


# ------------------------------------------------------------------------------------------------ one run
@dataclass
class Run:
    side: str
    workload: str
    round: int
    rc: int
    seconds: float
    load_before: float
    first_step_s: float = float("nan")
    median_step_ms: float = float("nan")
    p10_step_ms: float = float("nan")  # a steady step: the machine's scheduling noise only ever adds time
    mean_step_ms: float = float("nan")
    cpu_step_ms: float = float("nan")  # CPU seconds per step, per rank (mean of the ranks), all threads
    main_cpu_step_ms: float = float("nan")  # the same, the training (main) thread alone: no gloo threads
    steps_timed: int = 0
    maxrss_mb: list[float] = field(default_factory=list)
    cuda_peak_mb: list[float] = field(default_factory=list)
    threads: list[int] = field(default_factory=list)
    weights: str | None = None
    log: str = ""
    error: str | None = None
    audit: list[dict[str, Any]] | None = None
    ddp: dict[str, Any] | None = None
    startup: dict[str, float] = field(default_factory=dict)  # phase -> seconds (milestones reached by all ranks)
    rss_at: dict[str, float] = field(default_factory=dict)  # milestone -> resident MiB (the largest rank)


def run_once(side: str, workload: str, rnd: int, args, root: Path, audit: bool = False) -> Run:
    out = root / workload / f"r{rnd:02d}-{side}{'-audit' if audit else ''}"
    out.mkdir(parents=True)
    log = out / "output.log"
    cmd = command(side, workload, args, out)
    load = os.getloadavg()[0]
    with open(log, "w") as fh:
        fh.write("$ " + " ".join(cmd) + "\n")
        fh.flush()
        t0 = time.time()
        proc = subprocess.Popen(cmd, cwd=REPO, env=environment(side, args, out, audit), stdout=fh,
                                stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True)
        try:
            rc = proc.wait(timeout=args.timeout)
        except subprocess.TimeoutExpired:
            rc = -9
        finally:
            end_tree(proc)  # nothing of a run may linger into the next one, nor outlive this script
    run = Run(side, workload, rnd, rc, time.time() - t0, load, log=str(log))
    ranks = sorted(out.glob("rank*.json"))
    if rc != 0 or len(ranks) != args.nproc:
        tail = log.read_text(errors="replace").splitlines()[-15:]
        run.error = f"exit {rc}, {len(ranks)} of {args.nproc} rank files; log {log}:\n    " + "\n    ".join(tail)
        return run
    infos = [json.loads(p.read_text()) for p in ranks]
    intervals, cpu_per_step, main_per_step, n_steps, elapsed = [], [], [], 0, 0.0
    for info in infos:
        wall = [(s, e, t) for s, e, t, *_ in info["steps"]]
        cpu = [(s, e, c) for s, e, _, c, *_ in info["steps"]]
        main = [(r[0], r[1], r[4]) for r in info["steps"] if len(r) > 4]
        intervals += step_intervals(wall, args.warmup)
        n, total = window(wall, args.warmup)
        n_cpu, total_cpu = window(cpu, args.warmup)
        n_steps, elapsed = n_steps + n, elapsed + total
        if n_cpu:
            cpu_per_step.append(total_cpu / n_cpu)
        n_main, total_main = window(main, args.warmup)
        if n_main:
            main_per_step.append(total_main / n_main)
    if not intervals:
        run.error = f"no steps after the {args.warmup}-step warm-up (log {log})"
        return run
    run.first_step_s = max(i["first_step_at"] for i in infos) - t0
    run.median_step_ms = 1e3 * median(intervals)
    run.p10_step_ms = 1e3 * quantile(intervals, 0.1)
    run.mean_step_ms = 1e3 * elapsed / n_steps
    run.cpu_step_ms = 1e3 * sum(cpu_per_step) / len(cpu_per_step)
    if main_per_step:
        run.main_cpu_step_ms = 1e3 * sum(main_per_step) / len(main_per_step)
    run.steps_timed = n_steps // len(infos)
    run.maxrss_mb = [i["maxrss_kb"] / 1024 for i in infos]
    run.cuda_peak_mb = [i["cuda_peak_bytes"] / 2**20 for i in infos if i.get("cuda_peak_bytes") is not None]
    run.threads = [i["threads"] for i in infos]
    run.weights = str(out / "weights.pt") if (out / "weights.pt").exists() else None
    run.audit = [i["audit"] for i in infos if i.get("audit")] or None
    run.ddp = next((i["ddp"] for i in infos if i.get("ddp")), None)
    run.startup = startup_phases(t0, infos)
    marks = set.intersection(*(set(i.get("rss_mb") or {}) for i in infos))
    run.rss_at = {m: max(i["rss_mb"][m] for i in infos) for m in RSS_MARKS if m in marks}
    return run


RSS_MARKS = ("imports done", "process group", "model wrapped", "first step", "end")
STARTUP_PHASES = ("launcher, until the workers start", "worker: interpreter and imports",
                  "recipe and process group", "data, model, DDP wrap, optimizer", "first step")


def startup_phases(t0: float, infos: list[dict[str, Any]]) -> dict[str, float]:
    """Seconds per start-up phase, between milestones every rank had reached (the latest rank's times)."""
    try:
        points = [t0, max(i["started_at"] for i in infos)]
        points += [max(i["marks"][m] for i in infos) for m in ("imports done", "process group", "model wrapped")]
        points.append(max(i["first_step_at"] for i in infos))
    except (KeyError, TypeError):
        return {}
    return {name: b - a for name, a, b in zip(STARTUP_PHASES, points[:-1], points[1:], strict=True)}


# ------------------------------------------------------------------------------------------------ checks
def recipe_drift(workload: str) -> list[str]:
    """Where the hand-written loop's constants no longer match the shipped recipe (A and B must train alike)."""
    from omegaconf import OmegaConf

    from benchmarks.handwritten import WORKLOADS
    from mgpucli.config import load_recipe

    cfg = load_recipe(str(RECIPES[workload]), [])
    w = WORKLOADS[workload]
    want = {"seed": w["seed"], "data.batch_size": w["batch_size"], "trainer.epochs": w["epochs"],
            "optim.lr": w["lr"], "trainer.clip_grad_norm": w["clip_grad_norm"], "trainer.grad_accum": 1,
            "trainer.precision": "fp32", "trainer.compile": False}
    if workload == "mlp":
        want.update({"optim._target_": "torch.optim.SGD", "optim.momentum": w["momentum"],
                     "scheduler.T_max": w["T_max"], "model.hidden": [64, 64], "model.in_features": 32,
                     "data.train.num_samples": 4096})
    else:
        want.update({"optim._target_": "torch.optim.AdamW", "optim.weight_decay": w["weight_decay"],
                     "scheduler": None, "vars.block_size": w["block_size"], "model.d_model": 128,
                     "model.n_layer": 2})
    drift = []
    for key, value in want.items():
        got = OmegaConf.select(cfg, key, default="<missing>")
        got = OmegaConf.to_container(got) if OmegaConf.is_config(got) else got
        if got != value:
            drift.append(f"{key}: recipe {got!r}, hand-written {value!r}")
    return drift


def compare_weights(a: str | None, b: str | None) -> tuple[bool | None, str]:
    """(bitwise equal?, detail). Compares every tensor's bytes, after the key sets."""
    if not a or not b:
        return None, "weights missing"
    import torch

    wa, wb = torch.load(a, weights_only=True), torch.load(b, weights_only=True)
    if wa.keys() != wb.keys():
        return False, f"different keys: {sorted(set(wa) ^ set(wb))[:4]}"
    for k in wa:
        x, y = wa[k].contiguous(), wb[k].contiguous()
        if x.shape != y.shape or x.dtype != y.dtype:
            return False, f"{k}: {tuple(x.shape)}/{x.dtype} vs {tuple(y.shape)}/{y.dtype}"
        if not torch.equal(x.view(torch.uint8) if x.dim() else x.reshape(1).view(torch.uint8),
                           y.view(torch.uint8) if y.dim() else y.reshape(1).view(torch.uint8)):
            diff = (x.double() - y.double()).abs().max().item()
            return False, f"{k} differs (max abs diff {diff:.3g})"
    return True, f"{len(wa)} tensors identical"


def summarise_audit(run: Run, log_every: int, warmup: int) -> dict[str, Any]:
    """Hot-path facts from an audit run: collectives only at log steps (at most one: short intervals share one),
    host syncs only at the step after one (where the all-reduce, started at the log step, is read: the Trainer's
    _finish_reduction), and no object growth."""
    out: dict[str, Any] = {}
    if not run.audit:
        return {"error": run.error or "no audit data"}
    per_rank = run.audit
    sync_steps, coll_steps, coll_log, growth = set(), set(), [], []
    for rank_audit in per_rank:
        rows = rank_audit["per_step"]
        for step, syncs, colls, _ in rows:
            on_log = step % log_every == 0
            if syncs and step % log_every != 1 % log_every:
                sync_steps.add(step)
            if colls and not on_log:
                coll_steps.add(step)
            if on_log:
                coll_log.append(colls)
        # Live objects are counted (after a full collection) at every log step, less those the closed log
        # intervals hold until their reduction (the probe's count): the median change per step between
        # consecutive counts shows a steady leak and ignores one-time jumps (the first validation).
        # The probe writes out rank 0's TensorBoard queue (bounded, tested on its own) before each count.
        counted = [(s, objs) for s, _, _, objs in rows if s > warmup and objs >= 0]
        if len(counted) > 1:
            growth.append(median([(o1 - o0) / (s1 - s0) for (s0, o0), (s1, o1) in pairwise(counted)]))
    out["steps"] = max((r["per_step"][-1][0] for r in per_rank if r["per_step"]), default=0)
    out["host_syncs_outside_log_interval"] = sorted(sync_steps)
    out["collectives_outside_log_interval"] = sorted(coll_steps)
    out["collectives_per_log_interval"] = sorted(set(coll_log))
    out["live_objects_growth_per_step"] = [round(g, 3) for g in growth]
    out["cuda_sync_warnings"] = sum(r.get("cuda_sync_warnings", 0) for r in per_rank)
    out["ddp"] = run.ddp
    return out


# ------------------------------------------------------------------------------------------------ CLI start-up
def cli_startup(repeats: int) -> dict[str, Any]:
    """Wall time of ``mgpu --version``, ``mgpu --help`` and bare ``python -c pass`` (the floor), interleaved;
    and which heavy modules ``mgpu --help`` imports (none may be torch, omegaconf or hydra)."""
    mgpu = _tool("mgpu", "mgpucli")
    cases = {"mgpu --version": [*mgpu, "--version"], "mgpu --help": [*mgpu, "--help"],
             "python -c pass (floor)": [sys.executable, "-c", "pass"]}
    times: dict[str, list[float]] = {k: [] for k in cases}
    for _ in range(repeats):
        for name, cmd in cases.items():
            t0 = time.perf_counter()
            subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=True)
            times[name].append(time.perf_counter() - t0)
    heavy = {}
    for flag in ("--help", "--version"):
        res = subprocess.run([sys.executable, "-X", "importtime", "-c",
                              f"import sys; sys.argv=['mgpu', '{flag}']; from mgpucli.cli.app import main; main()"],
                             capture_output=True, text=True)
        mods = {line.split("|")[-1].strip().split(".")[0] for line in res.stderr.splitlines() if "|" in line}
        heavy[flag] = sorted(mods & {"torch", "omegaconf", "hydra", "numpy", "torchdata"})
    return {"command": " ".join(mgpu), "seconds": times, "heavy_imports": heavy}


# ------------------------------------------------------------------------------------------------ report
def machine_facts(args) -> dict[str, Any]:
    cpu = "unknown"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    import torch

    facts = {"cpu": cpu, "cores": available_cores(),
             "python": platform.python_version(), "torch": torch.__version__, "platform": platform.platform(),
             "processes": args.nproc, "threads_per_process": args.threads,
             "device": f"{args.nproc} CUDA GPU(s) (nccl)" if args.gpus else f"CPU, {args.nproc} gloo processes",
             "date": time.strftime("%Y-%m-%d %H:%M:%S %Z")}
    if args.gpus:
        facts["gpu"] = torch.cuda.get_device_name(0)
    return facts


def _row(name: str, a: list[float], b: list[float], rel: str, limit: float | None, unit: str, digits: int = 2):
    """One table row: each side's median over rounds, the paired per-round B/A (or B-A) summarised, the 95%
    interval of its median, and, against a target, whether the rounds resolve it (``resolved_verdict``)."""
    sa, sb = spread(a), spread(b)
    per_round = paired_ratios(b, a) if rel == "ratio" else [y - x for x, y in zip(a, b, strict=True)]
    r, ci = spread(per_round), median_interval(per_round)
    ok = resolved_verdict(ci, limit) if limit is not None else ""
    target = "" if limit is None else (f"<= {limit:.2f}" if rel == "ratio" else f"<= +{limit:.1f} s")
    return (f"| {name} | {sa.median:.{digits}f} {unit} | {sb.median:.{digits}f} {unit} | {r.fmt(3)} | "
            f"{ci.fmt(3)} | {target} | {ok} |",
            {"A": asdict(sa), "B": asdict(sb), rel: asdict(r), "ci95": asdict(ci), "target": limit, "verdict": ok})


def report_workload(workload: str, runs: list[Run], args, drift: list[str]) -> tuple[list[str], dict[str, Any]]:
    pairs = {}
    for run in runs:
        pairs.setdefault(run.round, {})[run.side] = run
    good = [(p["A"], p["B"]) for _, p in sorted(pairs.items()) if "A" in p and "B" in p
            and p["A"].error is None and p["B"].error is None]
    lines = [f"### {workload} ({RECIPES[workload].relative_to(REPO)}), {len(good)} paired rounds, "
             f"{good[0][0].steps_timed if good else 0} timed steps per rank per run", ""]
    data: dict[str, Any] = {"rounds": len(good), "drift": drift}
    if drift:
        lines.append("**The hand-written loop no longer matches the recipe:** " + "; ".join(drift))
        lines.append("")
    if not good:
        lines.append("no successful pair of runs")
        return lines, data
    a_runs, b_runs = [p[0] for p in good], [p[1] for p in good]

    def col(attr, runs_):
        return [getattr(r, attr) for r in runs_]

    lines += ["| metric | hand-written (A) | mgpu (B) | B/A or B-A per round: median (IQR, range) | "
              "95% interval of that median | target | |", "|---|---|---|---|---|---|---|"]
    rows = [
        ("step time, median of steps", "median_step_ms", "ratio", STEP_TARGET[workload], "ms"),
        ("step time, 10th percentile of steps", "p10_step_ms", "ratio", None, "ms"),
        ("step time, mean (log intervals included)", "mean_step_ms", "ratio", None, "ms"),
        ("CPU time per step per rank (all threads)", "cpu_step_ms", "ratio", None, "ms"),
        ("CPU time per step per rank (training thread)", "main_cpu_step_ms", "ratio", None, "ms"),
        ("time to first step (from command start)", "first_step_s", "diff", FIRST_STEP_TARGET_S, "s"),
    ]
    for name, attr, rel, limit, unit in rows:
        line, d = _row(name, col(attr, a_runs), col(attr, b_runs), rel, limit, unit, 3 if unit == "ms" else 2)
        lines.append(line)
        data[attr] = d
    mem_a = [max(r.maxrss_mb) for r in a_runs]
    mem_b = [max(r.maxrss_mb) for r in b_runs]
    line, d = _row("peak RSS per rank (max of ranks)", mem_a, mem_b, "ratio", MEMORY_TARGET, "MB", 1)
    lines.append(line)
    data["maxrss_mb"] = d
    if args.nproc > 1:
        line, d = _row("peak RSS of ranks other than 0", [max(r.maxrss_mb[1:]) for r in a_runs],
                       [max(r.maxrss_mb[1:]) for r in b_runs], "ratio", None, "MB", 1)
        lines.append(line)
        data["maxrss_mb_other_ranks"] = d
    if all(r.cuda_peak_mb for r in a_runs + b_runs):
        line, d = _row("peak CUDA memory per rank", [max(r.cuda_peak_mb) for r in a_runs],
                       [max(r.cuda_peak_mb) for r in b_runs], "ratio", MEMORY_TARGET, "MB", 1)
        lines.append(line)
        data["cuda_peak_mb"] = d
    verdicts = [compare_weights(a.weights, b.weights) for a, b in good]
    same_a = [compare_weights(a_runs[0].weights, a.weights)[0] for a in a_runs[1:]]
    same_b = [compare_weights(b_runs[0].weights, b.weights)[0] for b in b_runs[1:]]
    equal = all(v[0] for v in verdicts)
    detail = verdicts[0][1] if equal else next(v[1] for v in verdicts if not v[0])
    lines.append(f"| final weights bitwise equal (A vs B, every round) | | | "
                 f"{'yes' if equal else 'NO'}: {sum(bool(v[0]) for v in verdicts)}/{len(verdicts)} rounds; {detail}"
                 f"{'' if all(same_a + same_b) else '; runs of one side differ between rounds!'} | | equal | "
                 f"{'ok' if equal else 'MISSED'} |")
    data["bitwise_equal"] = {"rounds_equal": sum(bool(v[0]) for v in verdicts), "rounds": len(verdicts),
                             "detail": detail, "A_repeatable": all(same_a), "B_repeatable": all(same_b),
                             "verdict": "ok" if equal else "MISSED"}
    if all(r.startup for r in a_runs + b_runs):
        lines += ["", "time to first step by phase (median over rounds, seconds; milestones reached by every rank):",
                  "", "| phase | hand-written (A) | mgpu (B) | B-A |", "|---|---|---|---|"]
        data["startup"] = {}
        for phase in STARTUP_PHASES:
            pa, pb = median([r.startup[phase] for r in a_runs]), median([r.startup[phase] for r in b_runs])
            lines.append(f"| {phase} | {pa:.2f} | {pb:.2f} | {pb - pa:+.2f} |")
            data["startup"][phase] = {"A": pa, "B": pb}
    if all(r.rss_at for r in a_runs + b_runs):
        lines += ["", "resident memory at each milestone (MiB, the largest rank, median over rounds; the peak is "
                  "ru_maxrss at the end):", "", "| milestone | hand-written (A) | mgpu (B) | B-A |",
                  "|---|---|---|---|"]
        data["rss_at"] = {}
        for mark in RSS_MARKS:
            va = [r.rss_at[mark] for r in a_runs if mark in r.rss_at]
            vb = [r.rss_at[mark] for r in b_runs if mark in r.rss_at]
            if va and vb:
                lines.append(f"| {mark} | {median(va):.1f} | {median(vb):.1f} | {median(vb) - median(va):+.1f} |")
                data["rss_at"][mark] = {"A": median(va), "B": median(vb)}
    threads = sorted({t for r in a_runs + b_runs for t in r.threads})
    loads = [r.load_before for r in a_runs + b_runs]
    lines += ["", f"intra-op threads per process seen: {threads}; 1-min load average before the runs: "
              f"median {median(loads):.2f}, range {min(loads):.2f}-{max(loads):.2f}"]
    failed = [r for r in runs if r.error]
    for r in failed:
        lines.append(f"\nround {r.round} {r.side} failed: {r.error}")
    data["runs"] = [asdict(r) | {"audit": None} for r in runs]
    return lines, data


def report_interleaved(workload: str, sliced: dict[str, Any]) -> tuple[list[str], dict[str, Any]]:
    """The time-sliced sessions (benchmarks/interleaved.py): median step per slice, paired B/A. A diagnostic
    beside the rounds, so it carries no verdict: the target is shown for reference and cannot fail the run."""
    r, ci = sliced["ratio"], sliced["ci95"]
    lines = [f"step time with both jobs time-sliced against each other ({sliced['sessions']} sessions of "
             f"{sliced['epochs']} epochs per job, {sliced['slice_s']:.2f} s slices; benchmarks/interleaved.py; "
             "a diagnostic, no verdict):", "",
             "| metric | hand-written (A) | mgpu (B) | B/A per slice pair: median (IQR, range) | "
             "95% interval of that median | the rounds' target |", "|---|---|---|---|---|---|",
             f"| step time, median per slice | {sliced['A_ms']:.3f} ms | {sliced['B_ms']:.3f} ms | {r.fmt(3)} | "
             f"{ci.fmt(3)} | <= {STEP_TARGET[workload]:.2f} |"]
    lines += [f"\nsession failed: {e}" for e in sliced["errors"]]
    data = {k: v for k, v in sliced.items() if k not in ("ratio", "ci95")}
    return lines, data | {"ratio": asdict(r), "ci95": asdict(ci), "target": STEP_TARGET[workload]}


def same_process(workload: str, args, log=None) -> dict[str, Any]:
    """benchmarks/inprocess.py on ``workload``: both loops in the same ``--nproc`` processes, taking turns step
    by step (DDP over gloo on both sides). Returns its JSON summary, or ``{"error": ...}``."""
    from benchmarks import inprocess

    rounds = SAME_PROCESS_ROUNDS[workload] if args.same_process is None else args.same_process
    limit = max(args.timeout, 1200.0)  # one comparison is tens of thousands of steps: ~5 min on the MLP here
    worker = inprocess.worker_args(argparse.Namespace(workload=workload, rounds=rounds, chunk=1, log_every=None))
    if log is not None:
        log(f"[{workload} same processes] {rounds} step pairs: inprocess.py {' '.join(worker)} on "
            f"{args.nproc} process(es)")
    return inprocess.distributed_json(inprocess.__file__, worker, args.nproc, limit, threads=args.threads)


def report_same_process(workload: str, d: dict[str, Any]) -> tuple[list[str], dict[str, Any]]:
    """The same-process comparison's rows. The ratio of its totals (all of mgpu's steps against all of the
    hand-written loop's, every log interval and shared all-reduce counted) carries the step target's verdict:
    steps a few milliseconds apart see the same state of the machine, which separate runs do not."""
    b = d.get("blocks", {})
    head = (f"step time with both loops in the same {d.get('processes', '?')} process(es) "
            f"(benchmarks/inprocess.py: DDP over gloo on both sides, each with its own model, optimizer and "
            f"loader, taking turns every {d.get('chunk', '?')} step(s), {d.get('rounds', '?')} pairs; blocks of "
            f"{b.get('steps_per_side', '?')} steps per side, one log interval; mgpu's malloc thresholds on both sides; "
            "what it leaves out: the launcher, start-up, mgpu's GC settings and threads):")
    if "error" in d:
        return [head, "", f"failed: {d['error']}"], d
    target = STEP_TARGET[workload]
    total_ci = Interval(**b["ratio_ci95"])
    verdict = resolved_verdict(total_ci, target)
    block, block_ci = Spread(**b["block_ratio"]), Interval(**b["block_ratio_ci95"])
    cpu_ci = Interval(**b["cpu_diff_us_ci95"])
    lines = [head, "", "| metric | hand-written (A) | mgpu (B) | B/A or B-A | 95% interval | target | |",
             "|---|---|---|---|---|---|---|",
             f"| step time, mean of all steps (ratio of totals; bootstrap over {b['n']} blocks) | {b['A_us']:.0f} us | "
             f"{b['B_us']:.0f} us | {b['ratio']:.3f} | {total_ci.fmt(3)} | <= {target:.2f} | {verdict} |",
             f"| step time per block (median of block ratios, IQR, range) | | | {block.fmt(3)} | "
             f"{block_ci.fmt(3)} | | |",
             f"| training-thread CPU per step (B-A, us) | {b['cpu_A_us']:.0f} us | {b['cpu_B_us']:.0f} us | "
             f"{b['cpu_diff_us']:+.1f} | {cpu_ci.fmt(1)} | | |"]
    data = dict(d)
    data["blocks"] = b | {"target": target, "verdict": verdict}
    return lines, data


def report_cli(cli: dict[str, Any]) -> tuple[list[str], dict[str, Any]]:
    lines = [f"### CLI start-up ({cli['command']}, {len(next(iter(cli['seconds'].values())))} interleaved runs)", "",
             "| command | median | 95% interval of the median | IQR | range | target | |",
             "|---|---|---|---|---|---|---|"]
    data = {}
    for name, values in cli["seconds"].items():
        s, ci = spread(values), median_interval(values)
        limit = CLI_TARGET_S if name.startswith("mgpu") else None
        ok = resolved_verdict(ci, limit) if limit else ""
        lines.append(f"| `{name}` | {s.median:.3f} s | {ci.fmt(3)} | {s.q25:.3f}-{s.q75:.3f} s | "
                     f"{s.low:.3f}-{s.high:.3f} s | {f'< {limit:.1f} s' if limit else ''} | {ok} |")
        data[name] = asdict(s) | {"ci95": asdict(ci), "verdict": ok}
    for flag, mods in cli["heavy_imports"].items():
        lines.append(f"\nheavy modules imported by `mgpu {flag}`: {', '.join(mods) if mods else 'none'}")
    data["heavy_imports"] = cli["heavy_imports"]
    return lines, data


def report_audit(workload: str, facts: dict[str, Any], log_every: int) -> list[str]:
    if "error" in facts:
        return [f"- {workload}: audit run failed: {facts['error']}"]
    ddp = facts.get("ddp") or {}
    ok_sync = not facts["host_syncs_outside_log_interval"]
    ok_coll = not facts["collectives_outside_log_interval"]
    return [
        f"- {workload} ({facts['steps']} steps, log_every {log_every}): host syncs from mgpu's code outside the log "
        f"interval: {'none' if ok_sync else facts['host_syncs_outside_log_interval'][:10]}; Python collectives "
        f"outside it: {'none' if ok_coll else facts['collectives_outside_log_interval'][:10]}, per log step: "
        f"{facts['collectives_per_log_interval']}; live Python objects, median change per step (per rank): "
        f"{facts['live_objects_growth_per_step']}; CUDA sync warnings: {facts['cuda_sync_warnings']}; DDP: "
        f"gradient_as_bucket_view={ddp.get('gradient_as_bucket_view')}, bucket cap "
        f"{(ddp.get('bucket_bytes_cap') or 0) / 2**20:.0f} MiB, find_unused_parameters="
        f"{ddp.get('find_unused_parameters')}"
    ]


# ------------------------------------------------------------------------------------------------ main
def parse_args(argv: list[str] | None = None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter)
    dev = p.add_mutually_exclusive_group()
    dev.add_argument("--cpu", action="store_true", help="CPU processes with gloo (the default without --gpus)")
    dev.add_argument("--gpus", type=int, default=None, metavar="N", help="N CUDA GPUs with nccl, one process each")
    p.add_argument("--nproc", type=int, default=2, help="processes with --cpu (default 2)")
    p.add_argument("--workload", choices=["mlp", "charlm", "all", "none"], default="all")
    p.add_argument("--rounds", type=int, default=None,
                   help="interleaved A/B rounds (default: mlp 20, charlm 10; 0: only the time-sliced sessions)")
    p.add_argument("--epochs", type=int, default=None,
                   help="epochs per run on both sides (default: mlp 10, charlm the recipe's 2)")
    p.add_argument("--warmup", type=int, default=20, help="steps left out at the start of every run (default 20)")
    p.add_argument("--threads", type=int, default=None,
                   help="OMP_NUM_THREADS for both sides (default: cores / processes)")
    p.add_argument("--cli-repeats", type=int, default=20, help="runs of each CLI command (0: skip)")
    p.add_argument("--no-audit", action="store_true", help="skip the untimed hot-path audit run")
    p.add_argument("--same-process", type=int, default=None, metavar="N",
                   help="step pairs of the same-process comparison, benchmarks/inprocess.py (default: mlp 60000, "
                        "charlm 2000; 0: skip; CPU only)")
    p.add_argument("--interleaved", type=int, default=0, metavar="N",
                   help="diagnostics: N time-sliced sessions of both jobs per workload (benchmarks/interleaved.py)")
    p.add_argument("--cores", type=int, default=0, metavar="N",
                   help="diagnostics: N rounds of both whole jobs at once, each on a core of its own, swapping cores "
                        "every round (benchmarks/cores.py; Linux, 2+ cores)")
    p.add_argument("--slice", type=float, default=None, metavar="S",
                   help="seconds per slice in the time-sliced sessions (default: mlp 0.25, charlm 1.0)")
    p.add_argument("--timeout", type=float, default=600, help="seconds one run may take")
    p.add_argument("--pin", action="store_true",
                   help="pin each rank to one core on both sides (less migration noise; not how users run)")
    p.add_argument("--experiment", default="", metavar="NAMES",
                   help="diagnostics: swap pieces of mgpu's side (plain-loader, no-heartbeat, no-freeze; "
                        "comma-separated)")
    p.add_argument("--mgpu-override", action="append", default=[], metavar="KEY=VALUE",
                   help="an extra recipe override for the mgpu side only (experiments; repeatable)")
    p.add_argument("--json", type=Path, default=None, help="write every figure here")
    p.add_argument("--keep", action="store_true", help="keep the runs' directories (logs, weights)")
    args = p.parse_args(argv)
    if args.gpus is not None:
        args.nproc = args.gpus
    args.threads = args.threads or threads_per_process(args.nproc)
    return args


def _emit(lines: list[str]) -> None:
    """Print a finished section at once: a run cut short (a time limit) keeps what it measured."""
    print("\n".join(lines), flush=True)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.gpus:
        import torch

        if not torch.cuda.is_available() or torch.cuda.device_count() < args.gpus:
            print(f"overhead.py --gpus {args.gpus}: skipped, {torch.cuda.device_count()} CUDA GPU(s) visible "
                  f"(run it with --cpu here).")
            return 0
    exit_on_sigterm()  # a stopped benchmark kills what it started (benchmarks/children.py)
    workloads = {"all": ["mlp", "charlm"], "none": []}.get(args.workload, [args.workload])
    root = Path(tempfile.mkdtemp(prefix="mgpu-bench-"))
    facts = machine_facts(args)
    results: dict[str, Any] = {"machine": facts, "argv": sys.argv[1:], "workloads": {}}

    def save() -> None:
        if args.json:
            args.json.write_text(json.dumps(results, indent=1, default=str))

    _emit(["## mgpu overhead benchmark", "",
           f"machine: {facts['cpu']}, {facts['cores']} cores; {facts['device']}, {facts['threads_per_process']} "
           f"intra-op thread(s) each; Python {facts['python']}, torch {facts['torch']}"
           + (f", {facts['gpu']}" if facts.get("gpu") else "")
           + f"; {facts['date']}; 1-min load average at start {os.getloadavg()[0]:.2f}", "",
           "command: " + " ".join(["python", "benchmarks/overhead.py", *(argv if argv is not None else sys.argv[1:])]),
           ""])
    try:
        if args.cli_repeats:
            print(f"[cli] {args.cli_repeats} x (mgpu --version, mgpu --help, python -c pass)", file=sys.stderr)
            lines, results["cli"] = report_cli(cli_startup(args.cli_repeats))
            _emit(lines + [""])
            save()
        for workload in workloads:
            drift = recipe_drift(workload)
            runs: list[Run] = []
            rounds = DEFAULT_ROUNDS[workload] if args.rounds is None else args.rounds
            results["workloads"][workload] = {}
            for rnd, order in enumerate(round_orders(rounds)):
                for side in order:
                    run = run_once(side, workload, rnd, args, root)
                    runs.append(run)
                    status = run.error.splitlines()[0] if run.error else (
                        f"median {run.median_step_ms:.3f} ms, p10 {run.p10_step_ms:.3f} ms, mean "
                        f"{run.mean_step_ms:.3f} ms, cpu {run.cpu_step_ms:.3f} ms/step, first step "
                        f"{run.first_step_s:.2f} s, rss {max(run.maxrss_mb):.0f} MB")
                    print(f"[{workload} {rnd + 1}/{rounds} {side}] {status}", file=sys.stderr)
            if rounds:
                lines, results["workloads"][workload] = report_workload(workload, runs, args, drift)
                _emit(lines + [""])
                save()
            pairs = SAME_PROCESS_ROUNDS[workload] if args.same_process is None else args.same_process
            if pairs and args.gpus is None:
                lines, results["workloads"][workload]["same_process"] = report_same_process(
                    workload, same_process(workload, args, lambda line: print(line, file=sys.stderr)))
                _emit(lines + [""])
                save()
            sessions = args.interleaved
            if sessions and args.gpus is None:
                from benchmarks import interleaved

                sliced = interleaved.measure(workload, sessions, args, root, REPO, command, environment,
                                             lambda line: print(line, file=sys.stderr))
                lines, results["workloads"][workload]["interleaved"] = report_interleaved(workload, sliced)
                _emit(lines + [""])
                save()
            if args.cores and args.gpus is None:
                from benchmarks import cores

                paired = cores.measure(workload, args.cores, args, root, REPO, command, environment,
                                       lambda line: print(line, file=sys.stderr))
                lines, results["workloads"][workload]["cores"] = cores.report(workload, paired, STEP_TARGET[workload])
                _emit(lines + [""])
                save()
            if not args.no_audit:
                from mgpucli.config import load_recipe

                run = run_once("B", workload, 99, args, root, audit=True)
                log_every = int(load_recipe(str(RECIPES[workload]), []).trainer.log_every)
                facts_a = summarise_audit(run, log_every, args.warmup)
                results["workloads"][workload]["audit"] = facts_a
                _emit([f"hot-path audit ({workload}: one untimed mgpu run, the probe counting per step):",
                       *report_audit(workload, facts_a, log_every), ""])
                save()
        _emit([f"1-min load average at the end: {os.getloadavg()[0]:.2f}"])
    finally:
        if args.keep:
            print(f"runs kept in {root}", file=sys.stderr)
        else:
            shutil.rmtree(root, ignore_errors=True)
    save()
    return 1 if missed_targets(results) else 0


def missed_targets(results: dict[str, Any]) -> list[str]:
    """The workloads with a MISSED verdict: a row of the separate runs, or of the same-process comparison."""
    def verdicts(d: dict[str, Any]):
        for v in d.values():
            if isinstance(v, dict):
                yield v.get("verdict")
        for v in d.get("same_process", {}).values():
            if isinstance(v, dict):
                yield v.get("verdict")
    return [w for w, d in results["workloads"].items() if "MISSED" in verdicts(d)]


if __name__ == "__main__":
    sys.exit(main())
