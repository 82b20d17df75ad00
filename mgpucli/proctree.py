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
- :func:`kill_children`: SIGKILL every child of this process with its process group (torch's workers, started
  by the elastic agent inside ``mgpu launch``).
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import tempfile
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import IO, Any

__all__ = ["Finished", "children", "descendants", "kill_children", "kill_tree", "run_bounded", "start"]


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
    try:
        entries = os.listdir("/proc")
    except OSError:
        return tree
    for entry in entries:
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", encoding="utf-8", errors="replace") as f:
                stat = f.read()
        except OSError:
            continue  # it exited while we looked
        fields = stat.rsplit(")", 1)[-1].split()  # [state, ppid, ...] after the command name
        if len(fields) > 1 and fields[0] != "Z":
            tree.setdefault(int(fields[1]), []).append(int(entry))
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
    each worker in a session of its own: the group is the worker and its DataLoader processes). Returns their pids."""
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
    return killed
