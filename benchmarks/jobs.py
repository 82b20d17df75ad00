"""The jobs a benchmark starts: bounded in time, gone when the benchmark ends however it ends, and each rank's
peak resident memory read from outside.

A job runs in a session of its own. torchrun starts its workers in sessions of their own too, so the whole tree is
killed from the top down through /proc (:func:`mgpucli.proctree.kill_tree`) at the time limit, on Ctrl-C, and on
SIGTERM (which :func:`exit_on_sigterm` turns into ``SystemExit`` so that the ``finally`` that kills runs).

While a job runs, its process tree is read every ``poll_s`` seconds: a process with ``RANK`` in its environment
whose parent has none is that rank's worker, and its ``VmHWM`` (the kernel's peak resident set size) is kept.
The same reading serves both sides of a comparison; growth in a worker's last ``poll_s`` is not seen.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from mgpucli.proctree import descendants, kill_tree


def _exit(signum, frame) -> None:
    raise SystemExit(128 + signum)


def exit_on_sigterm() -> None:
    """From now on SIGTERM raises SystemExit (exit status 143) in the main thread: ``finally`` blocks run."""
    signal.signal(signal.SIGTERM, _exit)


def run_main(main: Callable[[], int]) -> None:
    """A benchmark's entry point: SIGTERM ends it as Ctrl-C does, every job it started killed; Ctrl-C exits 130
    with one line instead of a traceback."""
    exit_on_sigterm()
    try:
        code = main()
    except KeyboardInterrupt:
        print(f"{Path(sys.argv[0]).name}: stopped; the jobs it started are killed", file=sys.stderr)
        code = 130
    sys.exit(code)


@dataclass
class Finished:
    rc: int | None  # None: killed at the time limit
    seconds: float
    peak_rss_mib: dict[int, float] = field(default_factory=dict)  # global rank -> its worker's VmHWM


def _rank_and_parent(pid: int) -> tuple[int | None, int | None]:
    try:
        environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
        ppid = int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
    except (OSError, ValueError, IndexError):
        return None, None
    rank = next((v[5:] for v in environ if v.startswith(b"RANK=")), None)
    return (int(rank) if rank and rank.isdigit() else None), ppid


def peak_rss_kib(pid: int) -> int | None:
    """The kernel's high-water mark of ``pid``'s resident set (``VmHWM``), KiB; None once it is gone."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1])
    except (OSError, ValueError, IndexError):
        pass
    return None


def run(cmd: Sequence[str], env: dict[str, str], timeout: float, log: Path, cwd: Path | None = None,
        poll_s: float = 0.25) -> Finished:
    """Run ``cmd`` with its output in ``log``; the job's tree is killed at ``timeout`` seconds, or when this
    process is interrupted, and never outlives the call."""
    seen: dict[int, tuple[int | None, int | None]] = {}  # pid -> (rank, parent)
    peak: dict[int, float] = {}
    timed_out = False
    with open(log, "w") as fh:
        fh.write("$ " + " ".join(cmd) + "\n")
        fh.flush()
        t0 = time.time()
        proc = subprocess.Popen(list(cmd), cwd=cwd, env=env, stdout=fh, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, start_new_session=True)
        try:
            while proc.poll() is None:
                pids = descendants(proc.pid)
                seen.update((pid, _rank_and_parent(pid)) for pid in pids if pid not in seen)
                for pid in pids:
                    rank, parent = seen[pid]
                    if rank is None or seen.get(parent, (None, None))[0] is not None:
                        continue  # not a worker, or a worker's own child (a data loader process)
                    kib = peak_rss_kib(pid)
                    if kib is not None:
                        peak[rank] = max(peak.get(rank, 0.0), kib / 1024)
                try:
                    proc.wait(timeout=min(poll_s, max(0.0, t0 + timeout - time.time())))
                except subprocess.TimeoutExpired:
                    timed_out = time.time() - t0 >= timeout
                    if timed_out:
                        break
        finally:
            if proc.poll() is None:
                kill_tree(proc)
    return Finished(None if timed_out else proc.returncode, time.time() - t0, dict(sorted(peak.items())))
