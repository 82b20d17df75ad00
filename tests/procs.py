"""Helpers for tests that start processes: bounded in time, in their own session, and never left behind (through
:mod:`mgpucli.proctree`, as mgpu's own commands do)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from mgpucli import proctree
from mgpucli.launch.ports import free_port  # noqa: F401  (the launcher's own pick, for tests that pass a port)

REPO = Path(__file__).resolve().parents[1]
RECIPES = REPO / "recipes"
# Every process an end-to-end test starts carries a unique value of this variable (workers inherit it), so the
# test's teardown finds whatever it left behind (tests/e2e/conftest.py's ``tag``).
TAG = "MGPU_E2E_TAG"


def wait_until(predicate, timeout: float, every: float = 0.1):
    """``predicate()``'s first true value within ``timeout`` seconds, polled every ``every``; else its last value."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(every)
    return predicate()


@dataclass
class Result:
    returncode: int
    stdout: str
    stderr: str
    pid: int
    elapsed: float

    @property
    def output(self) -> str:
        return self.stdout + self.stderr


def assert_usage_error(r: Result, *fragments: str) -> None:
    """Exit 2, no traceback, and every fragment in stderr: how bad input must look to a user."""
    assert r.returncode == 2, r.output
    assert "Traceback" not in r.output, r.output
    for fragment in fragments:
        assert fragment in r.stderr, r.stderr


def _stat_fields(stat: str) -> list[str]:
    """/proc/PID/stat after the command name: [state, ppid, pgrp, ...]."""
    return stat.rsplit(")", 1)[1].split()


def proc_state(pid: int) -> str | None:
    """The one-letter state of ``pid`` (``Z`` for a zombie), None when it is gone."""
    try:
        return _stat_fields(Path(f"/proc/{pid}/stat").read_text())[0]
    except OSError:
        return None


def environ_of(pid: int) -> dict[str, str]:
    """The environment ``pid`` started with ({} when it is gone)."""
    try:
        raw = Path(f"/proc/{pid}/environ").read_bytes()
    except OSError:
        return {}
    return dict(item.decode(errors="replace").split("=", 1) for item in raw.split(b"\0") if b"=" in item)


def _each_process(name: str):
    """``(pid, bytes of /proc/PID/<name>)`` for every process whose file can still be read."""
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            yield int(entry.name), (entry / name).read_bytes()
        except OSError:
            continue


def tagged(var: str, value: str) -> list[int]:
    """Live (non-zombie) processes whose environment holds ``var=value``: a test's own processes, found by tag
    wherever they are in the process tree (torch's workers live in sessions of their own)."""
    needle = f"{var}={value}".encode()
    return [pid for pid, env in _each_process("environ")
            if needle in env.split(b"\0") and proc_state(pid) not in (None, "Z")]


def group_alive(pgid: int) -> list[int]:
    """Pids still running in process group ``pgid`` (zombies excluded)."""
    alive = []
    for pid, stat in _each_process("stat"):
        fields = _stat_fields(stat.decode(errors="replace"))
        if int(fields[2]) == pgid and fields[0] != "Z":
            alive.append(pid)
    return alive


def kill_group(pgid: int) -> None:
    try:
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def stop_tree(proc: subprocess.Popen, grace: float = 5.0) -> None:
    """SIGTERM (torchrun then stops its workers itself), then SIGKILL the whole tree: the workers of torch's
    launcher live in sessions of their own, so killing the launcher's group alone would orphan them."""
    proctree.kill_tree(proc, grace=grace)


def run(args: list[str], *, cwd: Path, env: dict[str, str] | None = None, timeout: float = 120) -> Result:
    """Run a command in a new session; whatever happens, nothing it started is left afterwards."""
    done = proctree.run_bounded(args, timeout, env={**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})}, cwd=cwd)
    if done.timed_out:
        raise AssertionError(f"timed out after {timeout}s: {' '.join(args)}\n{done.stdout}\n{done.stderr}")
    assert done.returncode is not None
    return Result(done.returncode, done.stdout, done.stderr, done.pid, done.seconds)


def mgpu(*args: str, cwd: Path, env: dict[str, str] | None = None, timeout: float = 120) -> Result:
    return run([sys.executable, "-m", "mgpucli", *args], cwd=cwd, env=env, timeout=timeout)


def torchrun(nproc: int, *args: str, cwd: Path, env: dict[str, str] | None = None, timeout: float = 180) -> Result:
    """``torchrun --standalone`` (a free port, a fresh run id) running ``mgpu`` workers."""
    return run([sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}",
                "-m", "mgpucli", *args], cwd=cwd, env=env, timeout=timeout)


def load_ckpt(path: Path) -> dict:
    """A checkpoint file, or a sharded checkpoint's directory as ``mgpu convert`` writes it as one file."""
    import torch

    if Path(path).is_dir():
        from mgpucli.engine.checkpoints.sharded_readers import to_full_file

        with tempfile.TemporaryDirectory(prefix="mgpu-test-ckpt-") as tmp:
            to_full_file(path, Path(tmp) / "converted.pt")
            return torch.load(Path(tmp) / "converted.pt", map_location="cpu", weights_only=True)
    return torch.load(path, map_location="cpu", weights_only=True)
