"""A recipe's workers start while the launcher checks it, and wait for its verdict (mgpucli/launch/gate.py): a
refused launch still leaves nothing behind."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

from mgpucli.launch import gate
from tests.procs import TAG, Result, assert_usage_error, proc_state
from tests.procs import tagged as tagged_by

REPO = Path(__file__).resolve().parents[2]

# A model whose module, imported by the launcher's check, returns only once a worker of the launch has started (the
# case under test: the workers start while the check is still going), and writes the workers it saw to workers.seen;
# its constructor refuses. Imported in a worker (local rank 0 builds the components), it does not wait.
SLOW_MODEL = """
import os
import sys
import time
from pathlib import Path

import torch


def _workers_of_this_launch() -> list[str]:
    needle = ("MGPU_E2E_TAG=" + os.environ["MGPU_E2E_TAG"]).encode()
    found = []
    for entry in Path("/proc").iterdir():
        try:
            if (entry.name.isdigit() and b"mgpucli.launch.worker" in (entry / "cmdline").read_bytes()
                    and needle in (entry / "environ").read_bytes().split(b"\\0")):
                found.append(entry.name)
        except OSError:
            pass
    return found


if sys.argv[0].endswith(os.path.join("mgpucli", "__main__.py")):  # the launcher, not a worker
    deadline = time.monotonic() + 60  # a ceiling that catches a launcher that never starts its workers
    while not (seen := _workers_of_this_launch()) and time.monotonic() < deadline:
        time.sleep(0.05)
    Path("workers.seen").write_text(" ".join(seen))


class Net(torch.nn.Module):
    def __init__(self, width: int = 8):
        super().__init__()
        if width < 0:
            raise ValueError(f"width must be positive, got {width}")
        self.fc = torch.nn.Linear(32, 4)
"""


def _launch_seeing_workers(tmp_path: Path, *args: str) -> tuple[Result, set[int], dict[str, str]]:
    """``mgpu launch ARGS`` in ``tmp_path``, its worker processes looked for every 0.1 s until it ends (a worker
    lives a second at least: it imports torch); (its result, the workers seen, its environment)."""
    env = {**os.environ, TAG: f"gate-{os.getpid()}", "OMP_NUM_THREADS": "1",
           "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    cmd = [sys.executable, "-m", "mgpucli", "launch", *args]
    proc = subprocess.Popen(cmd, cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    workers_seen: set[int] = set()
    try:
        while proc.poll() is None:
            workers_seen |= {pid for pid in tagged_by(TAG, env[TAG]) if b"mgpucli.launch.worker" in _cmdline(pid)}
            time.sleep(0.1)
        out, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    return Result(proc.returncode, out, err, proc.pid, 0.0), workers_seen, env


def test_a_refused_recipe_leaves_no_log_no_run_dir_and_no_process_of_the_workers_that_started(tmp_path):
    (tmp_path / "slowmodel.py").write_text(SLOW_MODEL)
    # the workers start while the check is still importing the slow module
    done, workers_seen, env = _launch_seeing_workers(
        tmp_path, "--cpu", "--nproc", "2", "quickstart", "model._target_=slowmodel.Net", "~model.in_features",
        "~model.out_features", "~model.hidden", "+model.width=-1")
    workers_seen |= {int(pid) for pid in (tmp_path / "workers.seen").read_text().split()}  # the check saw them
    assert workers_seen, "no worker started before the verdict"
    assert_usage_error(done, "model: building slowmodel.Net failed", "width must be positive")
    assert not (tmp_path / "runs").exists()  # no run dir, no worker log, no launch record
    assert "mgpu launch: 2 CPU worker(s)" not in done.stderr  # the banner belongs to a launch that goes ahead
    assert not [pid for pid in workers_seen if proc_state(pid) not in (None, "Z")]
    assert not tagged_by(TAG, env[TAG])


def test_a_target_refused_before_torchs_agent_starts_a_worker_starts_none(tmp_path):
    """A typo in a target's argument is refused as ``mgpu train`` refuses it: once the check could tell (torch's
    optimizer imported), not once the workers it would have started read the verdict."""
    done, workers_seen, env = _launch_seeing_workers(tmp_path, "--cpu", "--nproc", "2", "quickstart", "optim.lrr=0.1")
    assert_usage_error(done, "optim.lrr: torch.optim.SGD takes no argument 'lrr' (did you mean 'lr'?)")
    assert not workers_seen and not (tmp_path / "runs").exists()
    assert not tagged_by(TAG, env[TAG])


def _cmdline(pid: int) -> bytes:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return b""


LAUNCHER = """
import atexit, sys
atexit.register(lambda: print("launcher imported dynamo:", "torch._dynamo" in sys.modules, flush=True))
sys.argv = ["mgpu", *sys.argv[1:]]
from mgpucli.cli.app import main
main()
"""


def test_local_rank_0_builds_the_components_so_the_launcher_never_imports_dynamo(tmp_path):
    """The optimizer's check imports torch's dynamo (its first add_param_group does): the worker that needs it anyway
    builds the components and reports; the launcher still refuses a bad value, and trains a good recipe."""
    env = {**os.environ, "OMP_NUM_THREADS": "1",
           "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    base = [sys.executable, "-c", LAUNCHER, "launch", "--cpu", "--nproc", "2", "quickstart"]
    bad = subprocess.run([*base, "optim.momentum=-1"], cwd=tmp_path, env=env, capture_output=True, text=True,
                         timeout=180)
    assert_usage_error(Result(bad.returncode, bad.stdout, bad.stderr, 0, 0.0),
                       "optim: building torch.optim.SGD failed: ValueError: Invalid momentum value: -1")
    assert not (tmp_path / "runs").exists()
    good = subprocess.run([*base, "trainer.epochs=1", "data.train.num_samples=256"], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=180)
    assert good.returncode == 0, good.stderr
    assert "launcher imported dynamo: False" in good.stdout
    assert (tmp_path / "runs" / "quickstart" / "checkpoints" / "last.pt").exists()


# ------------------------------------------------------------ one worker's wait, this process its launcher
GATED_WORKER = "from mgpucli.launch.gate import wait_for_verdict; wait_for_verdict(); print('went', flush=True)"


def _gated_worker(verdict: Path, launcher_pid: int) -> subprocess.Popen:
    env = {**os.environ, gate.ENV: str(verdict), "MGPU_LAUNCH_PID": str(launcher_pid)}
    return subprocess.Popen([sys.executable, "-c", GATED_WORKER], env=env, stdout=subprocess.PIPE, text=True)


def _verdict(tmp_path: Path, word: str) -> tuple[int, str]:
    path = tmp_path / "verdict"
    proc = _gated_worker(path, os.getpid())  # this process is the worker's parent: its launcher
    try:
        time.sleep(0.5)
        assert proc.poll() is None  # waiting for the verdict
        path.write_text(json.dumps({"verdict": word}))
        out, _ = proc.communicate(timeout=60)
    finally:
        proc.kill()
        proc.wait()
    return proc.returncode, out


def test_a_worker_goes_on_at_go(tmp_path):
    assert _verdict(tmp_path, gate.GO) == (0, "went\n")


def test_a_refused_launch_ends_its_worker_with_exit_2_and_nothing_said(tmp_path):
    assert _verdict(tmp_path, gate.REFUSED) == (2, "")


def test_a_stray_variable_holds_up_no_process_whose_parent_is_no_launcher(tmp_path):
    proc = _gated_worker(tmp_path / "never-written", launcher_pid=1)
    out, _ = proc.communicate(timeout=60)
    assert (proc.returncode, out) == (0, "went\n")
