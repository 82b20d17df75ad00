"""The process trees a benchmark starts: bounded in time, and gone when the benchmark ends, however it ends.

``torchrun`` starts its workers in sessions of their own, so killing the group of a ``torchrun`` we started
leaves its workers running (the hand-written loop's went on to finish their epochs); mgpu's workers notice
that their launcher died, torchrun's don't. Every tree is therefore killed from the top down through /proc
(:func:`mgpucli.proctree.kill_tree`), and SIGTERM becomes ``SystemExit`` so that the ``finally`` that does it
runs when a benchmark is stopped, as it does on Ctrl-C.
"""

from __future__ import annotations

import signal
import subprocess
from collections.abc import Sequence

from mgpucli.proctree import kill_tree


def _exit(signum, frame) -> None:
    raise SystemExit(128 + signum)


def exit_on_sigterm() -> None:
    """From now on SIGTERM raises SystemExit (exit status 128 + 15) in the main thread: ``finally`` blocks run."""
    signal.signal(signal.SIGTERM, _exit)


def end_tree(proc: subprocess.Popen) -> None:
    """``proc`` (started with ``start_new_session=True``) and every process below it killed, if it still runs,
    and reaped."""
    if proc.poll() is None:
        kill_tree(proc)


def run_tree(cmd: Sequence[str], env: dict[str, str], timeout: float, cwd=None) -> tuple[int | None, str, str]:
    """Run ``cmd`` in a session of its own with its output captured; ``(exit status, stdout, stderr)``, or
    ``(None, "", "")`` after ``timeout`` seconds. Whatever happens, nothing it started outlives the call."""
    with subprocess.Popen(list(cmd), cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                          stdin=subprocess.DEVNULL, start_new_session=True) as proc:
        try:
            out, err = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            return None, "", ""
        finally:
            end_tree(proc)
    return proc.returncode, out, err
