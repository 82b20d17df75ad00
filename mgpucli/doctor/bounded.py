"""Run a child process that may hang, and make sure nothing of it survives a timeout.

Why not just ``os.killpg``: torch's launcher starts every worker with ``start_new_session=True``, so the
workers are in process groups of their own and a kill of the launcher's group leaves them running (adopted
by pid 1). On timeout we therefore freeze the launcher's group (so it cannot start anything new), kill every
descendant found through /proc, then kill the group itself.
"""

from __future__ import annotations

import subprocess
import tempfile
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from mgpucli.proctree import kill_tree


@dataclass(frozen=True)
class Finished:
    """How a bounded child ended."""

    returncode: int | None  # None when it was killed at the timeout
    stdout: str
    stderr: str
    timed_out: bool
    seconds: float


def _read(f) -> str:
    f.seek(0)
    return f.read().decode("utf-8", errors="replace")


def run_bounded(
    cmd: Sequence[str], timeout: float, env: Mapping[str, str] | None = None, cwd: str | None = None
) -> Finished:
    """Run ``cmd`` for at most ``timeout`` seconds; output goes to temp files (a hung grandchild holding a
    pipe open cannot block us). A missing executable raises FileNotFoundError like subprocess does."""
    start = time.monotonic()
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        proc = subprocess.Popen(
            list(cmd),
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=err,
            env=None if env is None else dict(env),
            cwd=cwd,
            start_new_session=True,
        )
        timed_out = False
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            timed_out = True
        finally:
            if proc.returncode is None or timed_out:
                kill_tree(proc)
        return Finished(
            returncode=None if timed_out else proc.returncode,
            stdout=_read(out),
            stderr=_read(err),
            timed_out=timed_out,
            seconds=time.monotonic() - start,
        )
