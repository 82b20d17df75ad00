"""The live test: start the planned processes through torch's launcher, read back what each rank saw.

``python -m torch.distributed.run --standalone`` is the engine ``mgpu launch`` uses (elastic agent, c10d
rendezvous on a free port); the doctor runs it as a bounded child (:func:`mgpucli.proctree.run_bounded`), so a
hung collective ends as a failed check after ``--timeout`` seconds, with every process killed. ``live_summary``
reads the outcome.
"""

from __future__ import annotations

import json
import math
import os
import sys
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from mgpucli import env_vars
from mgpucli.doctor.observation import Plan
from mgpucli.proctree import run_bounded

CPU_SIZES, CPU_ITERS = (64 * 2**10, 2**20, 8 * 2**20), 5
GPU_SIZES, GPU_ITERS = (2**20, 32 * 2**20, 256 * 2**20), 10
# Launcher state a user's shell may still hold; the launcher sets its own for the workers.
SCRUB = (
    *env_vars.ROLE,
    "MASTER_ADDR",
    "MASTER_PORT",
    "GROUP_RANK",
    "GROUP_WORLD_SIZE",
    "ROLE_RANK",
    "ROLE_WORLD_SIZE",
    "ROLE_NAME",
)
SCRUB_PREFIXES = (env_vars.PET_PREFIX, "TORCHELASTIC_")  # torchrun reads PET_<OPTION> as a default for --<option>


@dataclass(frozen=True)
class LiveOutcome:
    """What the launcher and the ranks reported."""

    nproc: int
    device: str  # "cpu" | "cuda"
    timeout: float
    returncode: int | None
    timed_out: bool
    seconds: float
    reports: dict[int, dict[str, Any]] = field(default_factory=dict)
    log_tail: str = ""


def live_env(base: Mapping[str, str], plan: Plan, cpus: int | None) -> dict[str, str]:
    """The workers' environment: the user's, minus stale launcher state, plus the plan's devices/threads."""
    env = {k: v for k, v in base.items() if k not in SCRUB and not k.startswith(SCRUB_PREFIXES)}
    if plan.cuda_visible_devices is not None:
        env["CUDA_VISIBLE_DEVICES"] = plan.cuda_visible_devices
    if plan.kind == "cpu":  # explicit, like mgpu's runtime: cores / processes, at least 1
        env["OMP_NUM_THREADS"] = str(max(1, (cpus or 1) // max(1, plan.nproc)))
    env["PYTHONUNBUFFERED"] = "1"
    return env


def live_command(plan: Plan, out_dir: str, timeout: float) -> list[str]:
    sizes, iters = (GPU_SIZES, GPU_ITERS) if plan.kind == "cuda" else (CPU_SIZES, CPU_ITERS)
    return [
        sys.executable, "-m", "torch.distributed.run", "--standalone", "--nnodes", "1",
        "--nproc-per-node", str(plan.nproc), "--max-restarts", "0",
        "-m", "mgpucli.doctor.live_worker", "--out", out_dir, "--device", plan.kind or "cpu",
        "--sizes", ",".join(map(str, sizes)), "--iters", str(iters), "--timeout", str(math.ceil(timeout)),
    ]  # fmt: skip


def run_live_test(plan: Plan, timeout: float, env: Mapping[str, str], cpus: int | None) -> LiveOutcome:
    """Run the launcher for at most ``timeout`` seconds; collect every rank's report."""
    with tempfile.TemporaryDirectory(prefix="mgpu-doctor-") as out_dir:
        cmd = live_command(plan, out_dir, timeout)
        if plan.kind == "cpu":
            cmd += ["--threads", live_env(env, plan, cpus)["OMP_NUM_THREADS"]]
        done = run_bounded(cmd, timeout, env=live_env(env, plan, cpus))
        reports = {}
        for rank in range(plan.nproc):
            try:
                with open(os.path.join(out_dir, f"rank{rank}.json"), encoding="utf-8") as f:
                    reports[rank] = json.load(f)
            except (OSError, ValueError):
                continue
    tail = "\n".join((done.stdout + done.stderr).strip().splitlines()[-15:])
    return LiveOutcome(
        plan.nproc, plan.kind or "cpu", timeout, done.returncode, done.timed_out, done.seconds, reports, tail
    )
