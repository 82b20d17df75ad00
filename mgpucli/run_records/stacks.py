"""Every worker's Python stacks, on request: where a stuck rank is stuck (stdlib only).

A launched worker registers :mod:`faulthandler` on ``SIGUSR2`` (:func:`install`): the signal makes it append every
thread's stack to ``stacks.txt`` beside its torch error file (``.../attempt_N/LOCAL_RANK/``), from a C handler that
works however stuck the Python code is (in a C call, in a blocking read, holding the GIL or not). ``mgpu launch``
asks every live rank for its stacks before it tears a failed job down, and ``mgpu doctor RUN_DIR --stacks`` asks a
running job. :func:`parse` reads the dumps back, :func:`user_frame` picks the innermost frame of the user's own code.
"""

from __future__ import annotations

import contextlib
import faulthandler
import glob
import linecache
import os
import re
import signal
import threading
import time
from dataclasses import asdict, dataclass, field
from typing import Any

from mgpucli.run_records.worker_records import RECORD_NAME

STACKS_NAME = "stacks.txt"
DUMP_SIGNAL = signal.SIGUSR2
_REQUESTED = "# mgpu: stacks requested at"
_HEADER = re.compile(r"^# mgpu: pid (?P<pid>\d+) main thread (?P<main>0x[0-9a-f]+)")
_THREAD = re.compile(r"^(?P<current>Current thread|Thread) (?P<ident>0x[0-9a-f]+) \(most recent call first\):")
_FRAME = re.compile(r'^\s+File "(?P<file>[^"]+)", line (?P<line>\d+) in (?P<func>\S+)')
# Where no user's code lives: the interpreter, installed packages, mgpu itself.
_NOT_USER = re.compile(r"/site-packages/|/dist-packages/|/lib/python3\.\d+/|^<|/mgpucli/")
_INTERPRETER = re.compile(r"^<")  # the import machinery's frozen frames: never where anything waits
_MGPU = re.compile(r"/mgpucli/")
_opened: list[Any] = []  # the stacks file of this process, kept open for the C handler


@dataclass
class Frame:
    file: str
    line: int
    function: str
    source: str = ""

    def cite(self) -> str:
        code = f": {self.source}" if self.source else ""
        return f"{self.file}:{self.line} in {self.function}{code}"


@dataclass
class ThreadStack:
    ident: str
    main: bool
    frames: list[Frame] = field(default_factory=list)  # innermost first


@dataclass
class Dump:
    """One rank's latest dump: its process, when the file last changed, and every thread's stack."""

    pid: int | None
    threads: list[ThreadStack]
    time: float | None = None

    @property
    def main(self) -> ThreadStack | None:
        return next((t for t in self.threads if t.main), self.threads[0] if self.threads else None)

    def to_json(self) -> dict[str, Any]:
        main = self.main
        frame = user_frame(main) if main else None
        return {"pid": self.pid, "time": self.time, "user_frame": asdict(frame) if frame else None,
                "threads": [asdict(t) for t in self.threads]}


def stacks_path(error_file: str) -> str:
    return os.path.join(os.path.dirname(error_file), STACKS_NAME)


def install(error_file: str | None) -> str | None:
    """In a worker: append every thread's stack to ``stacks.txt`` beside ``error_file`` on SIGUSR2. Returns its path
    (None without an error file, i.e. outside torchrun, or where it can't be written)."""
    if not error_file or not hasattr(signal, "SIGUSR2"):
        return None
    path = stacks_path(error_file)
    try:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        handle = open(path, "a", buffering=1)  # noqa: SIM115 - the C handler writes to it for the process's life
    except OSError:
        return None
    handle.write(f"# mgpu: pid {os.getpid()} main thread 0x{threading.main_thread().ident:016x}\n")
    # faulthandler puts the previous handler back when the interpreter shuts down: make that one "ignore", so a
    # request that arrives while this worker exits cannot kill it (SIGUSR2's default action terminates).
    signal.signal(DUMP_SIGNAL, signal.SIG_IGN)
    faulthandler.register(DUMP_SIGNAL, file=handle, all_threads=True, chain=False)
    _opened.append(handle)
    return path


def request(pids: list[int], paths: list[str], wait_s: float = 3.0) -> None:
    """Ask ``pids`` for their stacks and wait (up to ``wait_s``) until each of ``paths`` has grown. A marker line goes
    into each file first, so :func:`parse` knows where the latest dump starts."""
    for path in paths:
        with contextlib.suppress(OSError), open(path, "a") as fh:
            fh.write(f"{_REQUESTED} {time.time():.3f}\n")
    sizes = {p: _size(p) for p in paths}
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, DUMP_SIGNAL)
    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline and any(_size(p) <= sizes[p] for p in paths):
        time.sleep(0.05)
    time.sleep(0.2)  # a dump is written line by line: let its last lines land


def _size(path: str) -> int:
    try:
        return os.path.getsize(path)
    except OSError:
        return -1


def read_pid(path: str) -> int | None:
    """The pid the worker wrote when it installed the handler (the last one: a file is appended to)."""
    pid = None
    try:
        with open(path, errors="replace") as fh:
            for line in fh:
                found = _HEADER.match(line)
                if found:
                    pid = int(found["pid"])
    except OSError:
        return None
    return pid


def parse(path: str) -> Dump | None:
    """The latest dump in ``path``: what follows the last request marker (None when nothing does)."""
    try:
        with open(path, errors="replace") as fh:
            lines = fh.read().splitlines()
        stamp = os.path.getmtime(path)
    except OSError:
        return None
    pid = main_ident = None
    start = 0
    for i, line in enumerate(lines):
        header = _HEADER.match(line)
        if header:
            pid, main_ident, start = int(header["pid"]), header["main"], i + 1
        elif line.startswith(_REQUESTED):
            start = i + 1
    threads: list[ThreadStack] = []
    for line in lines[start:]:
        thread = _THREAD.match(line)
        if thread:
            ident = thread["ident"]
            main = _same_thread(ident, main_ident) if main_ident else thread["current"] == "Current thread"
            threads.append(ThreadStack(ident, main))
            continue
        frame = _FRAME.match(line)
        if frame and threads:
            number = int(frame["line"])
            source = linecache.getline(frame["file"], number).strip()
            threads[-1].frames.append(Frame(frame["file"], number, frame["func"], source))
    return Dump(pid, threads, stamp) if threads else None


def _same_thread(ident: str, main_ident: str | None) -> bool:
    return main_ident is not None and int(ident, 16) == int(main_ident, 16)


def is_users(path: str) -> bool:
    """Whether a frame's file is the user's own code (not the interpreter's, an installed package's or mgpu's)."""
    return not _NOT_USER.search(path)


def user_frame(thread: ThreadStack) -> Frame | None:
    """The innermost frame of the user's own code (not the interpreter's, an installed package's or mgpu's)."""
    return next((f for f in thread.frames if is_users(f.file)), None)


def code_frames(thread: ThreadStack) -> list[Frame]:
    """The thread's frames of code that has a file (innermost first): the interpreter's frozen import frames left
    out, so a rank caught importing a module shows what imported it."""
    return [f for f in thread.frames if not _INTERPRETER.match(f.file)]


def waiting_frame(thread: ThreadStack) -> Frame | None:
    """The innermost frame of any code: where the thread is waiting (a collective, a lock, a read)."""
    frames = code_frames(thread)
    return frames[0] if frames else None


def mgpu_frame(thread: ThreadStack) -> Frame | None:
    """The innermost frame of mgpu's own code: where in mgpu's loop a thread waiting in a library is."""
    return next((f for f in thread.frames if _MGPU.search(f.file)), None)


def request_live(error_files: list[str | None], wait_s: float = 3.0) -> list[str]:
    """Ask every live worker among those of ``error_files`` for its stacks (the launcher: before it stops a stalled
    or interrupted job). Returns the stacks files asked."""
    targets = []
    for error_file in error_files:
        path = stacks_path(error_file) if error_file else None
        pid = read_pid(path) if path else None
        if pid is not None and _alive(pid):
            targets.append((pid, path))
    if targets:
        request([pid for pid, _ in targets], [path for _, path in targets], wait_s)
    return [path for _, path in targets]


def request_siblings(error_file: str | None, wait_s: float = 3.0) -> list[str]:
    """From a failing worker, before it exits: ask the other live workers of its attempt on this node (whose
    stacks files name their pids) for their stacks, so the post-mortem shows where they were, stuck or waiting,
    before torch's agent tears them down. Returns the files asked."""
    if not error_file:
        return []
    attempt_dir = os.path.dirname(os.path.dirname(error_file))
    mine = os.path.dirname(error_file)
    targets = []
    for rank_dir in sorted(glob.glob(os.path.join(attempt_dir, "*"))):
        path = os.path.join(rank_dir, STACKS_NAME)
        failed = os.path.exists(os.path.join(rank_dir, RECORD_NAME))  # it is on its way out already
        pid = read_pid(path) if rank_dir != mine and not failed else None
        if pid is not None and pid != os.getpid() and _alive(pid):
            targets.append((pid, path))
    if targets:
        request([pid for pid, _ in targets], [path for _, path in targets], wait_s)
    return [path for _, path in targets]


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except (ProcessLookupError, PermissionError):
        return False
    return True


def dumps_of(stacks_files: dict[int, str], since: float | None = None) -> dict[int, Dump]:
    """rank -> its latest dump, for ranks whose stacks file holds one (written after ``since`` when given)."""
    found = {}
    for rank, path in sorted(stacks_files.items()):
        dump = parse(path)
        if dump is not None and (since is None or (dump.time or 0) >= since):
            found[rank] = dump
    return found


def describe(rank: int, dump: Dump) -> str:
    """``rank 1 was in data.py:12 in __getitem__: time.sleep(3600)`` (its innermost frame of the user's code), or
    where it was waiting when none of its frames is the user's."""
    main = dump.main
    frame = user_frame(main) if main else None
    if frame is not None:
        return f"rank {rank} was at {frame.cite()}"
    waiting = waiting_frame(main) if main else None
    if waiting is None:
        return f"rank {rank}: no Python frame in its dump"
    caller = mgpu_frame(main)
    under = f", under {caller.cite()}" if caller is not None and caller is not waiting else ""
    return f"rank {rank} was waiting at {waiting.cite()}{under}"
