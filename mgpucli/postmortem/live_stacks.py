"""``mgpu doctor RUN_DIR --stacks``: every running rank's Python stacks, asked for now (stdlib only).

Each worker of ``mgpu launch`` dumps its stacks on SIGUSR2 into ``stacks.txt`` beside its logs
(:mod:`mgpucli.run_records.stacks`), and wrote its pid at the top of that file. This finds the latest attempt's
ranks on this machine, checks that each pid still is that worker (its environment names the same torch error
file), asks them, and reads the dumps back. The job goes on training.
"""

from __future__ import annotations

import time

from mgpucli import procfs
from mgpucli.errors import MgpuError
from mgpucli.postmortem.reader import read_run
from mgpucli.run_records import stacks
from mgpucli.run_records.worker_records import ERROR_FILE_ENV


def running_stacks(run_dir: str, wait_s: float = 5.0) -> dict[int, stacks.Dump]:
    """rank -> its dump, for every rank of the run's latest attempt running on this machine. MgpuError (exit 1)
    when none is."""
    run = read_run(run_dir)
    if not run.attempts:
        raise MgpuError(f"{run_dir}: no worker of this run was started, so there are no stacks to ask for.")
    attempt = run.attempts[-1]
    files = {rank: stacks.stacks_path(f.error_file) for rank, f in attempt.ranks.items() if f.error_file}
    live = {}
    for rank, path in files.items():
        pid = stacks.read_pid(path)
        if pid is not None and _is_that_worker(pid, attempt.ranks[rank].error_file):
            live[rank] = pid
    if not live:
        raise MgpuError(f"{run_dir}: no rank of its latest attempt is running on this machine.",
                        "--stacks asks a running job (on the machine it runs on); `mgpu doctor RUN_DIR` without it "
                        "says how a finished or failed run ended, and quotes the stacks its ranks left.")
    asked = time.time()
    stacks.request(list(live.values()), [files[rank] for rank in live], wait_s)
    return stacks.dumps_of({rank: files[rank] for rank in live}, since=asked - 1)


def _is_that_worker(pid: int, error_file: str) -> bool:
    """The process ``pid`` is alive and is the worker whose torch error file is ``error_file`` (a pid can be reused)."""
    return procfs.environ_value(pid, ERROR_FILE_ENV) == error_file
