"""Test-only fault injection, inert unless ``MGPU_FAULT`` is set.

``MGPU_FAULT`` holds comma-separated faults, each ``NAME[@rank=R][@step=S]`` (a fault fires on every rank and
step unless narrowed). Faults:

- ``crash``: raise RuntimeError in the training step (``@step`` required to be useful).
- ``nan``: make the loss NaN at the step.
- ``sleep``: sleep ``MGPU_FAULT_SLEEP`` seconds (default 3600) inside the step (a stuck rank).
- ``kill_in_save``: SIGKILL this process in the middle of writing a checkpoint.
- ``sleep_in_save``: sleep ``MGPU_FAULT_SLEEP`` seconds in the middle of writing a checkpoint (a slow disk).
- ``disk_full_in_save``: raise ENOSPC in the middle of writing a checkpoint.
- ``tracker``: an experiment tracker's logging raises at the step (on rank 0's tracking thread).
- ``hold_last_save``: after the last step, wait before the run's final checkpoint is written until a stop signal
  (SIGINT/SIGTERM/SIGUSR1) arrives, or ``MGPU_FAULT_SLEEP`` seconds.
- ``hold_step``: in the training step (``@step``), wait until a stop signal arrives (SIGINT/SIGTERM/SIGUSR1, or
  torch's agent stopping the workers to admit a node) or ``MGPU_FAULT_SLEEP`` seconds: a job held at a known step.
- ``hold_async_save``: once a background save's shards are written (``trainer.async_save``), wait before it is
  committed (``last.dcp``) until a stop signal arrives, or ``MGPU_FAULT_SLEEP`` seconds: a save held in flight.
- ``hold_at_exit``: once the run finished (the final checkpoint complete, every rank agreed), wait before the
  teardown until a stop signal arrives, or ``MGPU_FAULT_SLEEP`` seconds: a job held in its teardown.

``MGPU_FAULT_ONCE=PATH`` makes the faults fire only if PATH does not exist yet (and creates it), so a
restarted worker group runs clean: a one-time crash.
"""

from __future__ import annotations

import errno
import os
import signal
import time
from collections.abc import Callable
from functools import lru_cache

from mgpucli import env_vars
from mgpucli.errors import UsageError

KNOWN = ("crash", "nan", "sleep", "kill_in_save", "sleep_in_save", "disk_full_in_save", "tracker", "hold_last_save",
         "hold_step", "hold_at_exit", "hold_async_save")  # as listed above


@lru_cache(maxsize=1)
def _parsed(spec: str) -> tuple[tuple[str, int | None, int | None], ...]:
    faults = []
    for item in filter(None, (s.strip() for s in spec.split(","))):
        name, *quals = item.split("@")
        if name not in KNOWN:
            raise _refused(spec, f"{name!r} is no fault (known: {', '.join(KNOWN)})")
        where: dict[str, int] = {}
        for q in quals:
            key, _, value = q.partition("=")
            if key not in ("rank", "step") or not value.strip().lstrip("-").isdigit():
                raise _refused(spec, f"{q!r} is neither rank=N nor step=N")
            where[key] = int(value)
        faults.append((name, where.get("rank"), where.get("step")))
    return tuple(faults)


def _refused(spec: str, problem: str) -> UsageError:
    return UsageError(f"MGPU_FAULT={spec!r}: {problem}. MGPU_FAULT injects faults for mgpu's own tests.",
                      "Unset it (`unset MGPU_FAULT`); a fault is NAME[@rank=R][@step=S], several comma-separated.")


def _armed(name: str, rank: int | None, step: int | None) -> bool:
    spec = os.environ.get("MGPU_FAULT")
    if not spec:
        return False
    for fname, frank, fstep in _parsed(spec):
        if fname == name and (frank is None or frank == rank) and (fstep is None or fstep == step):
            once = os.environ.get("MGPU_FAULT_ONCE")
            if once:
                try:
                    fd = os.open(once, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
                    os.close(fd)
                except FileExistsError:
                    return False
            return True
    return False


def enabled() -> bool:
    """Whether faults are armed; a spec that does not parse is a UsageError here, before the run takes its run dir,
    rather than a traceback at the first training step."""
    spec = os.environ.get("MGPU_FAULT")
    if spec:
        _parsed(spec)
        sleep = os.environ.get("MGPU_FAULT_SLEEP", "3600")
        try:
            float(sleep)
        except ValueError:
            raise UsageError(f"MGPU_FAULT_SLEEP={sleep!r} is not a number of seconds.",
                             "Unset it (default 3600), or give seconds: MGPU_FAULT_SLEEP=30.") from None
    return bool(spec)


def maybe_fault(point: str, rank: int | None = None, step: int | None = None, path: str | None = None) -> bool:
    """Fire the faults armed for ``point``; returns True when the caller should inject a NaN."""
    if not enabled():
        return False
    rank = rank if rank is not None else int(os.environ.get(env_vars.RANK, "0"))
    if point == "step":
        if _armed("crash", rank, step):
            raise RuntimeError(f"injected fault: crash at step {step} on rank {rank}")
        if _armed("sleep", rank, step):
            time.sleep(float(os.environ.get("MGPU_FAULT_SLEEP", "3600")))
        return _armed("nan", rank, step)
    if point == "tracker" and _armed("tracker", rank, step):
        raise RuntimeError(f"injected fault: the tracker failed to log step {step}")
    if point == "save":
        if _armed("kill_in_save", rank, step):
            os.kill(os.getpid(), signal.SIGKILL)
        if _armed("sleep_in_save", rank, step):
            time.sleep(float(os.environ.get("MGPU_FAULT_SLEEP", "3600")))
        if _armed("disk_full_in_save", rank, step):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), path)
    return False


def hold(name: str, until: Callable[[], bool], rank: int | None = None, step: int | None = None) -> None:
    """The hold fault ``name`` (``hold_last_save``, ``hold_step`` at ``step``, ``hold_at_exit``), where armed: wait
    until ``until()`` (the caller's "a stop signal arrived") or ``MGPU_FAULT_SLEEP`` seconds. A test holds a job
    there and signals it, no race."""
    if not enabled():
        return
    rank = rank if rank is not None else int(os.environ.get(env_vars.RANK, "0"))
    if _armed(name, rank, step):
        deadline = time.monotonic() + float(os.environ.get("MGPU_FAULT_SLEEP", "3600"))
        while not until() and time.monotonic() < deadline:
            time.sleep(0.05)
