"""Find and kill a process tree (pure stdlib, used by every command that starts torch's launcher).

Why not just ``os.killpg``: torch's launcher starts every worker with ``start_new_session=True``, so the
workers are in process groups of their own and a kill of the launcher's group leaves them running (adopted
by pid 1). So: freeze the launcher's group (it cannot start anything new), kill every descendant found
through /proc, then kill the group itself.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess


def descendants(pid: int) -> list[int]:
    """All processes below ``pid`` (children first-level first), read from /proc; [] where there is no /proc."""
    children: dict[int, list[int]] = {}
    try:
        entries = os.listdir("/proc")
    except OSError:
        return []
    for entry in entries:
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", encoding="utf-8", errors="replace") as f:
                stat = f.read()
        except OSError:
            continue  # it exited while we looked
        fields = stat.rsplit(")", 1)[-1].split()
        if len(fields) > 1:
            children.setdefault(int(fields[1]), []).append(int(entry))
    found: list[int] = []
    todo = [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def kill_tree(proc: subprocess.Popen) -> None:
    """SIGKILL ``proc`` (a session leader we started) and everything below it, wherever its group is."""
    pgid = proc.pid  # start_new_session=True: the child leads its own group
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
