"""When and how each worker ended, and an end to a failed attempt within seconds, whatever its other ranks do.

torch's agent reports the exit codes of the workers that failed, but not when each one ended, nor which of them it
ended itself: once one worker fails, it sends the others SIGTERM and, after its 30 s shutdown window, SIGKILL, and
then reports those as failures too. Told apart from the rank that started it only by time, the agent's own
signals would be blamed (a SIGKILL reads as the host's out-of-memory killer).

So the launcher watches its workers itself: a thread finds each worker of the latest attempt among its children
(torch starts them, in this process) and opens a pidfd on it; one waiter per worker blocks in ``waitid`` on that pidfd
with ``WNOWAIT`` (nothing is reaped: the agent still collects its children) and notes the exit code and the time the
moment the worker ends (:class:`~mgpucli.run_records.launch_record.RankExit`, recorded in ``launch.json``). From those,
:func:`mgpucli.run_records.first_failure.torn_down` tells the ranks the teardown ended from the rank that failed.

The watch also bounds that teardown. A recipe's ranks end at once on the agent's SIGTERM
(:mod:`mgpucli.launch.teardown`), a script's by default; a rank that does not (a script's own SIGTERM handler, native
code that never returns to Python) would hold the job for the agent's whole window. :data:`FAILED_ATTEMPT_GRACE_S`
after a worker ended with a failure, the watch SIGKILLs the group of every worker of that attempt still running,
unless the launcher itself is being stopped (Ctrl-C, a scheduler's signal: a preemption keeps torch's graceful
window), or the worker that ended was stopped gracefully (exit code 75: the others are finishing the same stop).
When the agent's poll reaps a worker before its waiter reads its code (``ECHILD``), the code is unknown here (torch
reports it); whether it failed is then what the worker's own record says (``mgpu_failure.json``, written before an
exception or a non-zero exit ends it): a worker killed outright in that race leaves the others to torch's window.
A worker that ended before the watch found it (a script that fails in its first moments, on a busy host) is never
found (a finished process's environment cannot be read): nothing is recorded of it, torch reports its code, and
:func:`~mgpucli.run_records.first_failure.first_to_fail` takes its own failure as the first.
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
import time
from collections.abc import Callable

from mgpucli import env_vars, procfs, proctree
from mgpucli.console import err_console
from mgpucli.errors import EXIT_PREEMPTED
from mgpucli.run_records.first_failure import failure_record_of
from mgpucli.run_records.launch_record import LaunchRecord, RankExit

FAILED_ATTEMPT_GRACE_S = 5.0  # after a worker failed: what the others get before the launcher ends them
_FIND_EVERY_S = 0.05
_FIND_FOR_S = 60.0  # the agent starts an attempt's workers at once: one not found by then has ended already


class ExitWatch(threading.Thread):
    """Watches the workers of every attempt on this node; :meth:`finish` puts what it saw in the record."""

    def __init__(self, record: LaunchRecord, stopping: Callable[[], bool],
                 grace_s: float = FAILED_ATTEMPT_GRACE_S):
        super().__init__(name="mgpu-exit-watch", daemon=True)
        self.record, self.stopping, self.grace_s = record, stopping, grace_s
        self._exits: dict[int, dict[int, RankExit]] = {}  # attempt -> rank -> how it ended
        self._pidfds: dict[tuple[int, int], int] = {}  # (attempt, rank) -> a pidfd on its worker
        self._waiters: list[threading.Thread] = []
        self._lock = threading.Lock()
        self._finished = threading.Event()

    def run(self) -> None:
        if not hasattr(os, "pidfd_open"):
            return  # no pidfd (not Linux >= 5.3): exits stay unknown, the agent's teardown as it is
        seen: dict[int, float] = {}  # attempt -> when the watch first saw it
        while not self._finished.wait(_FIND_EVERY_S):
            attempt = self.record.attempts[-1] if self.record.attempts else None
            if attempt is None:
                continue
            since = seen.setdefault(attempt.attempt, time.monotonic())
            missing = any((attempt.attempt, r) not in self._pidfds for r in attempt.ranks)
            if missing and time.monotonic() - since < _FIND_FOR_S:
                self._find_workers()

    def finish(self) -> None:
        """Stop looking, let the waiters of ended workers write down what they saw, and record every attempt's exits
        (``Attempt.exits``). Call it once torch's agent has returned: its workers have ended."""
        self._finished.set()
        self.join(timeout=5)
        for waiter in self._waiters:
            waiter.join(timeout=1)
        with self._lock:
            for attempt in self.record.attempts:
                attempt.exits.update(self._exits.get(attempt.attempt, {}))
            for fd in self._pidfds.values():
                with contextlib.suppress(OSError):
                    os.close(fd)
            self._pidfds = {}

    def _find_workers(self) -> None:
        workers = {files.error_file: (attempt.attempt, rank) for attempt in list(self.record.attempts)
                   for rank, files in attempt.ranks.items() if files.error_file}
        for pid in proctree.children():
            found = workers.get(_error_file_of(pid))
            if found is None or found in self._pidfds or not _leads_its_session(pid):
                continue  # not a worker (torch starts each in a session of its own; what it starts inherits its env)
            try:
                fd = os.pidfd_open(pid)
            except OSError:
                continue  # already gone (and reaped): the agent reports it
            self._pidfds[found] = fd
            waiter = threading.Thread(target=self._wait, args=(*found, pid, fd), name="mgpu-exit-waiter",
                                      daemon=True)
            self._waiters.append(waiter)
            waiter.start()

    def _wait(self, attempt: int, rank: int, pid: int, fd: int) -> None:
        try:
            info = os.waitid(os.P_PIDFD, fd, os.WEXITED | os.WNOWAIT)
        except ChildProcessError:
            info = None  # reaped before this thread read it (the agent's poll came first): the code is torch's to say
        except OSError:
            return
        ended = RankExit(_exit_code(info), time.time())
        with self._lock:
            first = not any(e.code not in (0, None) for e in self._exits.get(attempt, {}).values())
            self._exits.setdefault(attempt, {})[rank] = ended
        if first and self._failed(attempt, rank, ended) and not self.stopping():
            timer = threading.Timer(self.grace_s, self._end_survivors, args=(attempt,))
            timer.daemon = True
            timer.start()

    def _failed(self, attempt: int, rank: int, ended: RankExit) -> bool:
        """Whether the worker ended with a failure (not 0, nor a graceful stop's 75). A code this watch could not read
        (the agent's poll reaped the worker first) is the one the worker's own record says, where it left one."""
        code = ended.code
        if code is None:
            found = self.record.attempt(attempt)
            files = found.ranks.get(rank) if found is not None else None
            left = failure_record_of(files) if files is not None else None
            code = left.exit_code if left is not None else None
        return code not in (0, None, EXIT_PREEMPTED)

    def _end_survivors(self, attempt: int) -> None:
        """The grace after a failure is over: SIGKILL the group of every worker of ``attempt`` still running (under
        the lock: :meth:`finish` closes the pidfds)."""
        with self._lock:
            if self.stopping() or self._finished.is_set():
                return
            ended = self._exits.get(attempt, {})
            killed = [rank for (number, rank), fd in sorted(self._pidfds.items())
                      if number == attempt and rank not in ended and _kill_group(fd)]
        if killed:
            failed = min((e.time, rank) for rank, e in ended.items() if e.code not in (0, None))[1]
            err_console().print(f"mgpu launch: rank(s) {', '.join(map(str, killed))} still running {self.grace_s:g} s "
                                f"after rank {failed} failed, despite torch's SIGTERM: killed (SIGKILL).",
                                markup=False, highlight=False)


def _error_file_of(pid: int) -> str | None:
    """The error file torch's agent gave a worker (``TORCHELASTIC_ERROR_FILE``, one per worker and attempt), which
    says which rank of which attempt it is; None for any other child, or one still between fork and exec (its
    environment is still this process's)."""
    return procfs.environ_value(pid, env_vars.ERROR_FILE) or None


def _leads_its_session(pid: int) -> bool:
    try:
        return os.getsid(pid) == pid
    except OSError:
        return False


def _exit_code(info) -> int | None:
    """torch's convention: the exit code, or minus the signal that killed the process."""
    if info is None:
        return None
    if info.si_code == os.CLD_EXITED:
        return info.si_status
    return -info.si_status


def _kill_group(fd: int) -> bool:
    """SIGKILL the worker the pidfd holds, with its process group (torch starts each in a session of its own: the
    worker and its DataLoader processes), if it is still running. The pidfd makes sure the pid is still that
    worker's."""
    pid = _pid_of(fd)
    try:
        if os.waitid(os.P_PIDFD, fd, os.WEXITED | os.WNOWAIT | os.WNOHANG) is not None:
            return False  # it ended meanwhile
        signal.pidfd_send_signal(fd, signal.SIGKILL)
    except OSError:
        return False
    with contextlib.suppress(OSError):
        if pid is not None and os.getpgid(pid) == pid:
            os.killpg(pid, signal.SIGKILL)  # its DataLoader processes too
    return True


def _pid_of(fd: int) -> int | None:
    """The pid a pidfd refers to."""
    return procfs.pidfd_pid(fd)
