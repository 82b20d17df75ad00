#!/usr/bin/env python
"""The DataParallel-vs-DistributedDataParallel claim, measured on this machine's GPUs (GPU only).

Three runs of one workload through ``mgpu launch``, each with the same per-GPU batch:

* ``single``: one process on one GPU (``--gpus 1``, ``trainer.strategy=single``);
* ``dp``: one process driving N GPUs with ``nn.DataParallel`` (``trainer.strategy=dp``, global batch N x B);
* ``ddp``: N processes, one per GPU (``trainer.strategy=ddp``, B per process).

Throughput is the median of the run's logged ``samples_per_s`` (global samples per second of wall time, one
value per log interval) after the first two intervals (CUDA start-up, allocator warm-up). Per-GPU scaling
efficiency is throughput / (N x single-GPU throughput).

    python benchmarks/dp_vs_ddp.py                 # all visible GPUs
    python benchmarks/dp_vs_ddp.py --gpus 4 --steps 80 --json dp_vs_ddp.json
    python benchmarks/dp_vs_ddp.py --cpu-smoke     # the same plumbing on 2 CPU processes (single and ddp only)

Where no CUDA GPU is visible it prints why it skipped and exits 0.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from benchmarks import jobs  # noqa: E402
from benchmarks.stats import median  # noqa: E402

RECIPE = REPO / "recipes" / "charlm.yaml"
WARMUP_INTERVALS = 2


def throughput(records: list[dict[str, Any]], skip: int = WARMUP_INTERVALS) -> float | None:
    """Median ``samples_per_s`` of the train records after the first ``skip`` (None without enough)."""
    values = [r["samples_per_s"] for r in records if r.get("split") == "train" and r.get("samples_per_s")]
    values = values[skip:] if len(values) > skip else []
    return median(values) if values else None


def efficiency(value: float | None, gpus: int, single: float | None) -> float | None:
    """Per-GPU scaling efficiency: value / (gpus x single); None when either is unknown."""
    if value is None or not single or gpus < 1:
        return None
    return value / (gpus * single)


def overrides(args, strategy: str, gpus: int, run_dir: Path) -> list[str]:
    """The recipe overrides of one run: a model big enough to keep a GPU busy, no validation, few saves."""
    per_gpu = args.batch_size
    batch = per_gpu * gpus if strategy == "dp" else per_gpu  # dp: one process splits its batch over the GPUs
    return [
        f"trainer.strategy={strategy}", f"data.batch_size={batch}", f"model.d_model={args.d_model}",
        f"model.n_layer={args.layers}", f"model.n_head={args.heads}", f"vars.block_size={args.block_size}",
        f"+data.train.num_chars={args.chars}", f"trainer.max_steps={args.steps}", "trainer.epochs=1000",
        f"trainer.log_every={args.log_every}", "trainer.val_every=0", "trainer.checkpoint_every=0",
        f"trainer.precision={args.precision}", f"run_dir={run_dir}",
    ]


def launch_command(args, strategy: str, gpus: int, run_dir: Path) -> list[str]:
    mgpu = Path(sys.executable).parent / "mgpu"
    base = [str(mgpu)] if mgpu.exists() else [sys.executable, "-m", "mgpucli"]
    devices = ["--cpu", "--nproc", str(gpus)] if args.cpu_smoke else ["--gpus", str(gpus)]  # the first N GPUs
    return [*base, "launch", *devices, str(RECIPE), *overrides(args, strategy, gpus, run_dir)]


def run(args, strategy: str, gpus: int, root: Path) -> dict[str, Any]:
    run_dir = root / f"{strategy}-{gpus}"
    cmd = launch_command(args, strategy, gpus, run_dir)
    log = root / f"{strategy}-{gpus}.log"
    print(f"[dp_vs_ddp] {strategy} on {gpus} {'process(es)' if args.cpu_smoke else 'GPU(s)'}", file=sys.stderr)
    done = jobs.run(cmd, dict(os.environ), args.timeout, log, cwd=REPO)  # the launcher and its workers, bounded
    rc = done.rc  # None: killed at the time limit
    metrics = run_dir / "metrics.jsonl"
    text = metrics.read_text() if metrics.exists() else ""
    records = [json.loads(line) for line in text.splitlines() if line.strip()]
    value = throughput(records)
    result = {"strategy": strategy, "gpus": gpus, "exit_code": rc, "seconds": round(done.seconds, 1),
              "samples_per_s": value, "intervals": sum(1 for r in records if r.get("split") == "train"),
              "command": " ".join(cmd)}
    if rc != 0 or value is None:
        tail = "\n    ".join(log.read_text(errors="replace").splitlines()[-12:])
        status = "timed out" if rc is None else f"exit {rc}"
        result["error"] = f"{status}, {result['intervals']} logged intervals; last lines of {log}:\n    {tail}"
    return result


def table(results: list[dict[str, Any]], single: float | None) -> list[str]:
    lines = ["| strategy | GPUs | samples/s | per-GPU scaling efficiency | run time | |", "|---|---|---|---|---|---|"]
    for r in results:
        eff = efficiency(r["samples_per_s"], r["gpus"], single)
        value = f"{r['samples_per_s']:.0f}" if r["samples_per_s"] else "-"
        lines.append(f"| {r['strategy']} | {r['gpus']} | {value} | {f'{eff:.2f}' if eff is not None else '-'} | "
                     f"{r['seconds']:.0f} s | {'failed' if r.get('error') else ''} |")
    return lines


def parse_args(argv: list[str] | None = None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--gpus", type=int, default=None, help="GPUs for dp and ddp (default: all visible)")
    p.add_argument("--steps", type=int, default=60, help="optimizer steps per run (default 60)")
    p.add_argument("--batch-size", type=int, default=32, help="samples per GPU per step (default 32)")
    p.add_argument("--d-model", type=int, default=384)
    p.add_argument("--layers", type=int, default=6)
    p.add_argument("--heads", type=int, default=6)
    p.add_argument("--block-size", type=int, default=256)
    p.add_argument("--chars", type=int, default=1_000_000, help="characters of generated training text")
    p.add_argument("--precision", choices=["fp32", "bf16", "fp16"], default="bf16")
    p.add_argument("--log-every", type=int, default=5)
    p.add_argument("--timeout", type=float, default=150, help="seconds one run may take (default 150)")
    p.add_argument("--json", type=Path, default=None, help="write every figure here")
    p.add_argument("--keep", action="store_true", help="keep the runs' directories")
    p.add_argument("--cpu-smoke", action="store_true",
                   help="check the plumbing on CPU processes (single and ddp, a tiny model, fp32); not a benchmark")
    args = p.parse_args(argv)
    if args.cpu_smoke:
        args.gpus = args.gpus or 2
        args.d_model, args.layers, args.heads, args.block_size, args.chars = 32, 1, 2, 32, 60_000
        args.batch_size, args.precision, args.steps, args.log_every = 8, "fp32", min(args.steps, 24), 4
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if not args.cpu_smoke:
        import torch

        visible = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if visible == 0:
            print("dp_vs_ddp.py: skipped: no CUDA GPU is visible. It compares single-GPU, nn.DataParallel and "
                  "DistributedDataParallel throughput, which needs GPUs (benchmarks/overhead.py runs on CPUs).")
            return 0
        args.gpus = min(args.gpus or visible, visible)
        device = f"{visible} x {torch.cuda.get_device_name(0)}, torch {torch.__version__}"
    else:
        device = f"CPU smoke test, {args.gpus} gloo processes"
    root = Path(tempfile.mkdtemp(prefix="mgpu-dp-ddp-"))
    results = []
    try:
        results.append(run(args, "single", 1, root))
        if args.gpus >= 2:
            if not args.cpu_smoke:
                results.append(run(args, "dp", args.gpus, root))
            results.append(run(args, "ddp", args.gpus, root))
    finally:
        if args.keep:
            print(f"runs kept in {root}", file=sys.stderr)
        else:
            shutil.rmtree(root, ignore_errors=True)
    single = results[0]["samples_per_s"]
    lines = ["## DataParallel vs DistributedDataParallel", "",
             f"{device}; workload: charlm with d_model {args.d_model}, {args.layers} layers, block {args.block_size}, "
             f"{args.batch_size} samples per GPU per step, {args.precision}, {args.steps} steps per run; throughput = "
             f"median logged samples/s after {WARMUP_INTERVALS} warm-up intervals", "", *table(results, single)]
    if args.gpus < 2:
        lines += ["", "dp and ddp need at least 2 GPUs: only the single-GPU figure was measured."]
    for r in results:
        if r.get("error"):
            lines += ["", f"{r['strategy']} failed: {r['error']}"]
    print("\n".join(lines))
    if args.json:
        args.json.write_text(json.dumps({"device": device, "args": {k: str(v) for k, v in vars(args).items()},
                                         "results": results}, indent=1))
    return 1 if any(r.get("error") for r in results) else 0


if __name__ == "__main__":
    jobs.run_main(main)
