"""Child processes that never outlive their caller: start one in a session of its own, bound it in time, collect
its output, and kill its whole process tree (stdlib only).

Every command that starts processes goes through here: ``mgpu doctor``'s probes and live test, the short jobs of
``mgpu validate``, the launcher's safety net for its workers, the tests and the benchmarks.

Why more than ``os.killpg``: torch's launcher starts every worker with ``start_new_session=True``, so the workers
are in process groups of their own and a kill of the launcher's group leaves them running (adopted by pid 1).
So a tree is killed from the top: freeze the child's group (it cannot start anything new), kill every descendant
found through /proc, then kill the group itself.

Public API:

- :func:`start`: ``subprocess.Popen`` in a new session, stdin from /dev/null.
- :func:`run_bounded`: start, wait at most ``timeout`` seconds, return a :class:`Finished` with the output;
  nothing the child started survives the call.
- :func:`kill_tree`: the child and everything below it, optionally after a SIGTERM and a grace period.
- :func:`children`, :func:`descendants`: live processes below a pid, read from /proc.
- :func:`kill_children`: SIGKILL every child of this process with its process group and everything below it
  (torch's workers, started by the elastic agent inside ``mgpu launch``, and what they left).
- :func:`adopt_orphans`: make this process a child subreaper (Linux), so that nothing started below it can leave its
  tree: a process whose parent exits (a double-forked daemon, a helper in a session of its own whose parent died) is
  re-parented to this process instead of pid 1.
- :func:`end_descendants`: end every process below this one, whatever session or process group it put itself in
  (a SIGTERM and a short grace, then SIGKILL; optionally sparing one group), and reap those that were its children.

Why ``prctl`` through ``ctypes`` and no library: psutil (not a dependency) reads the same /proc this module reads and
cannot make a process a subreaper; ``PR_SET_CHILD_SUBREAPER`` is one libc call, and /proc gives the tree.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import IO, Any

from mgpucli import procfs

__all__ = ["Finished", "adopt_orphans", "children", "descendants", "end_descendants", "kill_children", "kill_tree",
           "run_bounded", "start"]

_PR_SET_CHILD_SUBREAPER = 36  # <linux/prctl.h>
_END_WITHIN_S = 5.0  # how long end_descendants keeps looking for processes that are still exiting


def start(cmd: Sequence[str], *, env: Mapping[str, str] | None = None, cwd: str | os.PathLike | None = None,
          stdout: int | IO[Any] | None = None, stderr: int | IO[Any] | None = None,
          text: bool = False) -> subprocess.Popen:
    """Start ``cmd`` in a session (and process group) of its own, with stdin from /dev/null; ``env`` None: this
    process's environment; ``stdout``/``stderr`` as for ``subprocess.Popen`` (None: this process's), ``text`` for
    pipes read as text. A missing executable raises FileNotFoundError, as subprocess does."""
    return subprocess.Popen(list(cmd), stdin=subprocess.DEVNULL, stdout=stdout, stderr=stderr, text=text,
                            env=None if env is None else dict(env), cwd=cwd, start_new_session=True)


@dataclass(frozen=True)
class Finished:
    """How a bounded child ended."""

    returncode: int | None  # None when it was killed at the timeout
    stdout: str
    stderr: str
    timed_out: bool
    seconds: float
    pid: int


def _read(f) -> str:
    f.seek(0)
    return f.read().decode("utf-8", errors="replace")


def run_bounded(cmd: Sequence[str], timeout: float, *, env: Mapping[str, str] | None = None,
                cwd: str | os.PathLike | None = None) -> Finished:
    """Run ``cmd`` for at most ``timeout`` seconds and return its output; whatever happens (a timeout, an exception
    in the caller, Ctrl-C), the child and everything it started are killed before this returns. The output goes
    to temporary files, not pipes: a hung grandchild holding a pipe open cannot block the caller."""
    began = time.monotonic()
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        proc = start(cmd, env=env, cwd=cwd, stdout=out, stderr=err)
        timed_out = False
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            timed_out = True
        finally:
            kill_tree(proc)
        return Finished(returncode=None if timed_out else proc.returncode, stdout=_read(out), stderr=_read(err),
                        timed_out=timed_out, seconds=time.monotonic() - began, pid=proc.pid)


def _parents() -> dict[int, list[int]]:
    """Parent pid -> its live (non-zombie) children, from /proc ({} where there is no /proc)."""
    tree: dict[int, list[int]] = {}
    for pid in procfs.pids():
        found = procfs.state_and_parent(pid)  # None: it exited while we looked
        if found is not None and found[0] != "Z":
            tree.setdefault(found[1], []).append(pid)
    return tree


def children(pid: int | None = None) -> list[int]:
    """Live child processes of ``pid`` (default: this process)."""
    return _parents().get(os.getpid() if pid is None else pid, [])


def descendants(pid: int) -> list[int]:
    """All live processes below ``pid``, children first; [] where there is no /proc."""
    tree = _parents()
    found: list[int] = []
    todo = [pid]
    while todo:
        for child in tree.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def kill_tree(proc: subprocess.Popen, grace: float = 0.0) -> None:
    """SIGKILL ``proc`` (a session leader from :func:`start`) and everything below it, wherever its group is, and
    reap it. ``grace`` > 0: first SIGTERM its group and give it that many seconds to stop by itself (torchrun then
    stops its own workers)."""
    if grace > 0 and proc.poll() is None:
        with contextlib.suppress(ProcessLookupError, PermissionError, subprocess.TimeoutExpired):
            os.killpg(proc.pid, signal.SIGTERM)
            proc.wait(timeout=grace)
    pgid = proc.pid  # start_new_session=True: the child leads its own group
    if proc.poll() is None:  # once reaped, its pid may be another process's: only its group is left to kill
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pgid, signal.SIGSTOP)  # no new workers, no restarts while we look
        for _ in range(3):  # a second pass catches anything forked while we read /proc
            victims = descendants(proc.pid)
            for pid in victims:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(pid, signal.SIGKILL)
            if not victims:
                break
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signal.SIGKILL)
    proc.wait()


def kill_children() -> list[int]:
    """SIGKILL every child of this process, with its whole process group when it leads one (torch's agent starts
    each worker in a session of its own: the group is the worker and its DataLoader processes), and everything else
    below this process, wherever it put itself. Returns the children's pids."""
    killed = []
    for pid in children():
        try:
            if os.getpgid(pid) == pid:
                os.killpg(pid, signal.SIGKILL)
            else:
                os.kill(pid, signal.SIGKILL)
            killed.append(pid)
        except (ProcessLookupError, PermissionError):
            pass
    _kill_below(os.getpid())
    return killed


def adopt_orphans() -> bool:
    """Make this process a child subreaper (Linux ``prctl(PR_SET_CHILD_SUBREAPER)``): an orphan anywhere below it
    (a double-forked daemon, the children of a process that died) is re-parented to it instead of pid 1, so it stays
    among :func:`descendants` and :func:`end_descendants` ends it. Not inherited by children. False where the
    platform has no such thing (then an orphan escapes to pid 1 as before)."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return libc.prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


def _signal_all(pids, sig: int) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, sig)


def _below(pid: int, spare_group: int | None = None) -> list[int]:
    """Live processes below ``pid``, those in process group ``spare_group`` left out."""
    found = descendants(pid)
    if spare_group is None:
        return found
    out = []
    for below in found:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            if os.getpgid(below) != spare_group:
                out.append(below)
    return out


def _kill_below(pid: int, within_s: float = _END_WITHIN_S, spare_group: int | None = None) -> list[int]:
    """SIGKILL every process below ``pid`` (but those in ``spare_group``): freeze what is found (SIGSTOP: nothing
    forks while we look), look again until nothing new appears, kill it all, and repeat until nothing is left (a
    killed process's orphans come back to a subreaper) or ``within_s`` has passed (a process stuck in the kernel).
    Returns the pids killed."""
    killed: dict[int, None] = {}
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        found: dict[int, None] = {}
        for _ in range(50):  # a fork bomb is not our problem: bounded
            new = [p for p in _below(pid, spare_group) if p not in found]
            if not new:
                break
            _signal_all(new, signal.SIGSTOP)
            found.update(dict.fromkeys(new))
        if not found:
            break
        _signal_all(found, signal.SIGKILL)
        killed.update(found)
        time.sleep(0.01)  # a SIGKILLed process takes a moment to become a zombie, which descendants() leaves out
    return list(killed)


def end_descendants(grace: float = 0.0, spare_group: int | None = None) -> list[int]:
    """End every process below this one, whatever session or process group it is in (but ``spare_group``, when
    given): ``grace`` > 0 first sends each a SIGTERM and waits up to that many seconds for them to exit by themselves
    (a helper flushes its files), then SIGKILLs what is left. Those that were this process's children (its own, or
    orphans it adopted as a subreaper: :func:`adopt_orphans`) are reaped. Returns the pids ended. Meant for a
    process's last moments: it may reap a child another part of the program would have waited for."""
    me = os.getpid()
    below = _below(me, spare_group)
    if not below:
        return []
    mine = set(children(me))
    if grace > 0:
        _signal_all(below, signal.SIGTERM)
        deadline = time.monotonic() + grace
        while _below(me, spare_group) and time.monotonic() < deadline:
            time.sleep(0.02)
    ended = list(dict.fromkeys(below + _kill_below(me, spare_group=spare_group)))
    for pid in mine | set(ended):  # zombies now; a pid that is not our child is refused by the kernel
        with contextlib.suppress(ChildProcessError, OSError):
            os.waitpid(pid, os.WNOHANG)
    return ended
