"""Run a short mgpu command (e.g. ``validate``) on N local workers through torch's launcher engine.

``mgpu launch`` is the full job launcher (run dirs, logs, restarts). Commands that only need N cooperating
processes for a moment use this: ``torch.distributed.run --standalone`` (a free port and a fresh run id) in
its own session, the whole process tree killed if it overruns or the caller is interrupted.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping

from mgpucli.cpus import threads_per_process
from mgpucli.distributed.select import DeviceSelection
from mgpucli.launch.job_source import PET_PREFIX
from mgpucli.proctree import kill_tree, start


def worker_env(selection: DeviceSelection, environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment for the workers: GPU selection, and an explicit CPU thread count. Without torchrun's
    ``PET_*`` variables (a pod's job): the workers of this one machine are no node of that job."""
    env = {k: v for k, v in (os.environ if environ is None else environ).items() if not k.startswith(PET_PREFIX)}
    if selection.cuda_visible_devices is not None:
        env["CUDA_VISIBLE_DEVICES"] = selection.cuda_visible_devices
    if selection.kind == "cpu" and "OMP_NUM_THREADS" not in env:
        env["OMP_NUM_THREADS"] = str(threads_per_process(selection.nproc))
    return env


def run_workers(mgpu_args: list[str], selection: DeviceSelection, timeout: float | None = None) -> int:
    """Run ``mgpu <mgpu_args>`` on ``selection.nproc`` local workers; returns torchrun's exit code."""
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={selection.nproc}",
           "-m", "mgpucli", *mgpu_args]
    proc = start(cmd, env=worker_env(selection))
    try:
        return proc.wait(timeout=timeout)
    except BaseException:  # timeout, Ctrl-C, SIGTERM turned into an exception: nothing may outlive us
        kill_tree(proc)
        raise
