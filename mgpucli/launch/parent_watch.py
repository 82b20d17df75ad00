"""No worker outlives ``mgpu launch``: a worker-side watch on the launcher's pid.

If the launcher is SIGKILLed, torch's agent (which runs inside it) gets no chance to stop the workers, and
they would run on, adopted by pid 1. ``mgpu launch`` therefore puts its pid in ``MGPU_LAUNCH_PID``; each
worker starts a daemon thread that waits on a pidfd for that process (no polling: the kernel wakes the
thread the moment the launcher exits) and then SIGKILLs every process below the worker, wherever it put
itself (a helper in a session of its own, a double-forked daemon: the worker is their subreaper, see
:func:`mgpucli.launch.worker.keep_descendants`), the worker's whole process group, and the worker. torch starts
every worker in a session of its own, so that group is exactly the worker and its children (DataLoader
workers), never the user's shell.

Why not ``prctl(PR_SET_PDEATHSIG)``? It kills only the worker itself, and only when the *thread* that
forked it exits; the worker's DataLoader processes would be left to notice on their own (torch checks
every 5 s). The pidfd thread covers the whole group. Without pidfd support (Linux < 5.3) it polls every
0.2 s instead.
"""

from __future__ import annotations

import os
import select
import signal
import threading
import time
from collections.abc import Mapping

from mgpucli import env_vars, proctree

LAUNCH_PID_ENV = env_vars.LAUNCH_PID
_POLL_S = 0.2


def _kill_own_group() -> None:
    """SIGKILL this process and everything below it, and the whole group when this process leads it."""
    pid = os.getpid()
    try:
        proctree.kill_children()
        if os.getpgrp() == pid:
            os.killpg(pid, signal.SIGKILL)
    finally:
        os.kill(pid, signal.SIGKILL)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _wait_for_exit(pid: int) -> None:
    """Return once ``pid`` has exited."""
    try:
        fd = os.pidfd_open(pid)
    except ProcessLookupError:
        return
    except (AttributeError, OSError):
        while _alive(pid):
            time.sleep(_POLL_S)
        return
    try:
        poller = select.poll()
        poller.register(fd, select.POLLIN)
        while not poller.poll():
            pass
    finally:
        os.close(fd)


def watch_pid(pid: int, on_exit=_kill_own_group) -> threading.Thread:
    """Start a daemon thread that calls ``on_exit`` when process ``pid`` exits."""

    def run() -> None:
        _wait_for_exit(pid)
        on_exit()

    thread = threading.Thread(target=run, name="mgpu-launcher-watch", daemon=True)
    thread.start()
    return thread


def install_parent_watch(environ: Mapping[str, str] | None = None) -> threading.Thread | None:
    """Watch the launcher named by ``MGPU_LAUNCH_PID``; a no-op when it is not set (plain torchrun, tests)."""
    env = os.environ if environ is None else environ
    raw = env.get(LAUNCH_PID_ENV, "")
    if not raw.isdigit():
        return None
    return watch_pid(int(raw))
