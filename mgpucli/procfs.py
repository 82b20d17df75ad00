"""What mgpu reads under Linux's /proc, in one place (stdlib only, imports nothing of mgpu).

Each reader returns None (or nothing) where the process is gone or there is no /proc: a process can end between
two reads, so no caller treats a missing file as an error. The process tree (:mod:`mgpucli.proctree`), the
launcher's watch on its workers (:mod:`mgpucli.launch.exit_watch`), a worker's teardown
(:mod:`mgpucli.launch.teardown`), the post-mortem's live checks, the doctor's host probes and the port picker
(:mod:`mgpucli.launch.ports`) read through here.
"""

from __future__ import annotations

import os
from collections.abc import Iterator

_ROOT = "/proc"


def text(*parts: str | int) -> str | None:
    """The text of ``/proc/PART/...`` (``text(pid, "cgroup")``, ``text("cmdline")``); None when it cannot be read."""
    try:
        with open(os.path.join(_ROOT, *map(str, parts)), encoding="utf-8", errors="replace") as f:
            return f.read()
    except OSError:
        return None


def pids() -> Iterator[int]:
    """Every process's pid (none where there is no /proc)."""
    try:
        entries = os.listdir(_ROOT)
    except OSError:
        return
    yield from (int(entry) for entry in entries if entry.isdigit())


def state_and_parent(pid: int) -> tuple[str, int] | None:
    """``pid``'s one-letter state (``Z``: a zombie) and its parent's pid, from its ``stat``; None when it is gone."""
    stat = text(pid, "stat")
    fields = stat.rsplit(")", 1)[-1].split() if stat else []  # [state, ppid, ...] after the command name
    return (fields[0], int(fields[1])) if len(fields) > 1 else None


def environ_value(pid: int, name: str) -> str | None:
    """The value of ``name`` in the environment ``pid`` started with; None when it is gone or has none. Between fork
    and exec a child's environment is still its parent's."""
    try:
        with open(os.path.join(_ROOT, str(pid), "environ"), "rb") as f:
            raw = f.read()
    except OSError:
        return None
    key = os.fsencode(name) + b"="
    found = next((item[len(key):] for item in raw.split(b"\0") if item.startswith(key)), None)
    return os.fsdecode(found) if found is not None else None


def command_line(pid: int) -> list[str] | None:
    """``pid``'s command line, its arguments; None when it is gone."""
    raw = text(pid, "cmdline")
    return raw.rstrip("\0").split("\0") if raw is not None else None


def pidfd_pid(fd: int) -> int | None:
    """The pid a pidfd of this process refers to (its ``Pid:`` line in ``/proc/self/fdinfo``); None when it has ended
    or cannot be read."""
    for line in (text("self", "fdinfo", fd) or "").splitlines():
        if line.startswith("Pid:"):
            try:
                pid = int(line.split()[1])
            except (IndexError, ValueError):
                return None
            return pid if pid > 0 else None
    return None
