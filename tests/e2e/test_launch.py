"""``mgpu launch`` for real: CPU workers with gloo, real signals, real files.

Every process a test starts carries a unique ``MGPU_E2E_TAG`` in its environment (workers inherit it), so a
test finds all of them by pid through ``/proc/*/environ`` even after they were reparented, kills them by pid
in ``finally``, and asserts that none is left. Each launch runs in a session of its own, under a timeout,
with free ports; CPU runs use 2 processes.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from mgpucli import proctree
from tests.procs import TAG, free_port, proc_state, wait_until
from tests.procs import environ_of as env_of
from tests.procs import tagged as tagged_by

REPO = Path(__file__).resolve().parents[2]
RECIPE = str(REPO / "recipes" / "quickstart.yaml")


def tagged(tag: str) -> list[int]:
    """Live (non-zombie) processes carrying ``MGPU_E2E_TAG=tag``."""
    return tagged_by(TAG, tag)


# Same math in every run that is compared: 1 epoch (64 steps at 2 x 32), a checkpoint every 20 steps, 1 thread.
SHORT = ["trainer.epochs=1", "trainer.checkpoint_every_steps=20", "trainer.cpu_threads=1"]
LONG = ["trainer.epochs=200", "trainer.log_every=5"]  # runs until the test interrupts it


class Launch:
    """One ``mgpu launch`` process, its output in files, and everything it started, found by tag."""

    def __init__(self, args: list[str], cwd: Path, tag: str, env: dict[str, str] | None = None, name: str = "launch",
                 wrapper: tuple[str, ...] = ()):
        """``wrapper``: the command that runs ``mgpu launch`` (``("timeout", "240")``); ``pid`` is then its pid."""
        self.tag, self.cwd = tag, cwd
        self.out_path, self.err_path = cwd / f"{name}.out", cwd / f"{name}.err"
        inherited = {k: v for k, v in os.environ.items() if not k.startswith("MGPU_FAULT")}
        full_env = {**inherited, "PYTHONUNBUFFERED": "1", TAG: tag, **(env or {})}
        with open(self.out_path, "w") as out, open(self.err_path, "w") as err:
            self.proc = proctree.start([*wrapper, sys.executable, "-m", "mgpucli", "launch", *args], cwd=cwd,
                                       env=full_env, stdout=out, stderr=err)
        self.pid = self.proc.pid

    def wait(self, timeout: float) -> int:
        try:
            return self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            stacks = self.stacks()
            raise AssertionError(f"mgpu launch still running after {timeout}s:\n{self.output}\n{stacks}") from None

    def stacks(self) -> str:
        """Python stacks of every process of this test (py-spy, where installed): what a hang was waiting on."""
        import shutil

        if not shutil.which("py-spy"):
            return "(install py-spy to see the stacks of a hung launch)"
        dumps = []
        for pid in tagged(self.tag):
            done = subprocess.run(["py-spy", "dump", "--pid", str(pid)], capture_output=True, text=True, timeout=30)
            dumps.append(f"--- pid {pid} (RANK={env_of(pid).get('RANK', '-')})\n{done.stdout}{done.stderr}")
        return "\n".join(dumps)

    @property
    def output(self) -> str:
        return self.out_path.read_text(errors="replace") + self.err_path.read_text(errors="replace")

    def workers(self) -> dict[int, int]:
        """Global rank -> pid of launch's worker processes."""
        out = {}
        for pid in tagged(self.tag):
            env = env_of(pid)
            if pid != self.pid and "RANK" in env and env.get("MGPU_LAUNCH_PID") == str(self.pid):
                try:
                    ppid = int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
                except OSError:
                    continue
                if ppid == self.pid:
                    out[int(env["RANK"])] = pid
        return out

    def cleanup(self) -> None:
        """Kill launch's group and every tagged process, by pid."""
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.pid, signal.SIGKILL)
        for pid in tagged(self.tag):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(timeout=10)


def rank0_log(run_dir: Path, attempt: int = 0) -> Path | None:
    found = sorted(run_dir.glob(f"logs/*/attempt_{attempt}/0/stderr.log"))
    return found[-1] if found else None


def wait_for_training(run_dir: Path, launch: Launch, timeout: float = 60) -> None:
    def training():
        log = rank0_log(run_dir)
        if launch.proc.poll() is not None:
            raise AssertionError(f"launch exited early ({launch.proc.returncode}):\n{launch.output}")
        return log is not None and re.search(r"step \d+ epoch", log.read_text(errors="replace"))

    assert wait_until(training, timeout), f"training never started:\n{launch.output}"


def final_weights(run_dir: Path) -> dict:
    import torch

    ckpt = torch.load(run_dir / "checkpoints" / "last.pt", map_location="cpu", weights_only=True)
    return ckpt["model"]


def assert_same_weights(a: dict, b: dict) -> None:
    import torch

    assert a.keys() == b.keys()
    for key in a:
        assert torch.equal(a[key], b[key]), f"{key} differs"


def _module_probe(tmp_path: Path) -> dict[str, str]:
    """Env for a launch whose workers write the modules they imported to ``modules-rank<RANK>.txt`` at exit."""
    probe = tmp_path / "probe"
    probe.mkdir()
    (probe / "sitecustomize.py").write_text(
        "import atexit, os, sys\n"
        "def _dump():\n"
        "    if 'RANK' in os.environ:\n"
        f"        name = os.path.join({str(tmp_path)!r}, 'modules-rank' + os.environ['RANK'] + '.txt')\n"
        "        with open(name, 'w') as fh:\n"
        "            fh.write('\\n'.join(sorted(sys.modules)))\n"
        "atexit.register(_dump)\n")
    return {"PYTHONPATH": os.pathsep.join(filter(None, [str(probe), os.environ.get("PYTHONPATH")]))}


def run_launch(args, cwd, tag, env=None, timeout=120, name="launch") -> tuple[int, Launch]:
    launch = Launch(args, cwd, tag, env, name)
    try:
        return launch.wait(timeout), launch
    finally:
        launch.cleanup()


def run_side_by_side(jobs: dict[str, tuple[list[str], Path]], timeout: float) -> dict[str, tuple[int, Launch]]:
    """Launches that only wait (a stall window, a collective timeout), started at once so that one wait serves them
    all: name -> (args, working directory) in, name -> (exit code, the launch) out; none may leave a process."""
    tag = uuid.uuid4().hex
    launches = {name: Launch(args, cwd, tag) for name, (args, cwd) in jobs.items()}
    try:
        codes = {name: launch.wait(timeout) for name, launch in launches.items()}
    finally:
        for launch in launches.values():
            launch.cleanup()
    assert wait_until(lambda: not tagged(tag), 20), f"processes left behind: {tagged(tag)}"
    return {name: (codes[name], launch) for name, launch in launches.items()}


# --------------------------------------------------------------------------------------------- tests
@pytest.fixture(scope="module")
def short_run(tmp_path_factory) -> tuple[Path, Launch]:
    """One uninterrupted one-node, two-process SHORT run (its working directory and its finished launch), its
    workers probed for the modules they imported: the run test_cpu_run_trains_... checks, and the weights
    ``baseline`` gives the runs compared with it (one launch for both)."""
    cwd = tmp_path_factory.mktemp("baseline")
    tag = uuid.uuid4().hex
    env = {"HF_TOKEN_FOR_TEST": "do-not-record", "TORCH_SECRET_TOKEN": "nor-this", **_module_probe(cwd)}
    code, launch = run_launch(["--cpu", "--nproc", "2", RECIPE, *SHORT, f"run_dir={cwd / 'run'}"], cwd, tag, env)
    assert code == 0, launch.output
    assert wait_until(lambda: not tagged(tag), 20), f"processes left behind: {tagged(tag)}"
    return cwd, launch


def test_cpu_run_trains_writes_per_rank_logs_and_launch_json(short_run):
    tmp_path, launch = short_run
    run_dir = tmp_path / "run"
    out = launch.output
    for rank in ("0", "1"):  # a worker whose output goes to files imports neither typer nor rich, nor mgpu's CLI
        modules = set((tmp_path / f"modules-rank{rank}.txt").read_text().split())
        assert "mgpucli.engine.trainer" in modules and not modules & {"typer", "rich", "tensorboard"}, rank
        assert not [m for m in modules if m == "mgpucli.cli" or m.startswith("mgpucli.cli.")], rank
    assert "[rank0]:" in out and "[rank1]:" not in out  # rank 0 streams to the terminal, rank 1 does not
    assert (run_dir / "checkpoints" / "last.pt").is_file()
    data = json.loads((run_dir / "launch.json").read_text())
    assert data["result"]["status"] == "succeeded"
    assert data["torchrun"].split(" torchrun ")[1].startswith("--nnodes 1 --nproc-per-node 2 ")
    assert "OMP_NUM_THREADS=1" in data["torchrun"]
    (attempt,) = data["attempts"]
    assert sorted(attempt["ranks"]) == ["0", "1"]
    for rank, files in attempt["ranks"].items():
        assert Path(files["stderr"]).parent == Path(attempt["dir"]) / rank
        assert Path(files["stdout"]).is_file() and Path(files["stderr"]).is_file()
    # every rank's own output is in its file, rank 1's included
    assert "mgpu train quickstart" in Path(attempt["ranks"]["0"]["stderr"]).read_text()
    assert Path(attempt["dir"]).is_relative_to(run_dir / "logs")
    assert data["env"]["OMP_NUM_THREADS"] == "1" and data["env"]["MGPU_LAUNCH_PID"] == str(launch.pid)
    recorded = json.dumps(data)
    assert "do-not-record" not in recorded and "nor-this" not in recorded and "PATH" not in data["env"]


def test_dry_run_prints_the_command_and_starts_nothing(tmp_path: Path, tag: str):
    run_dir = tmp_path / "run"
    code, launch = run_launch(["--cpu", "--nproc", "2", "--dry-run", RECIPE, f"run_dir={run_dir}"], tmp_path, tag,
                              timeout=60)
    assert code == 0, launch.output
    stdout = launch.out_path.read_text()
    assert stdout.count("torchrun --nnodes 1 --nproc-per-node 2") == 1
    assert "-m mgpucli.launch.worker train" in stdout and "trainer.device=cpu" in stdout
    assert not run_dir.exists()


def test_bad_input_is_exit_2_before_any_process(tmp_path: Path, tag: str):
    with socket.socket() as busy:
        busy.bind(("0.0.0.0", 0))
        busy.listen(1)
        port = busy.getsockname()[1]
        code, launch = run_launch(["--cpu", "--master-port", str(port), RECIPE], tmp_path, tag, timeout=60)
        assert code == 2 and f"--master-port {port}" in launch.output and "in use" in launch.output
    code, launch = run_launch(["--cpu", RECIPE, "trainer.epochz=1"], tmp_path, tag, timeout=60)
    assert code == 2 and launch.output.count("problem(s) in recipe") == 1  # once, by the launcher
    assert "Traceback" not in launch.output
    if not _has_cuda():
        code, launch = run_launch([RECIPE], tmp_path, tag, timeout=60)  # no --cpu on a machine without CUDA
        assert code == 2 and "--cpu --nproc N" in launch.output
    assert not (tmp_path / "runs").exists()


def test_a_second_ctrl_c_kills_the_workers_at_once(tmp_path: Path, tag: str):
    run_dir = tmp_path / "run"
    # rank 1 sleeps inside step 30, so the graceful stop the first Ctrl-C asks for cannot finish
    env = {"MGPU_FAULT": "sleep@rank=1@step=30", "MGPU_FAULT_SLEEP": "120"}
    launch = Launch(["--cpu", "--nproc", "2", RECIPE, *LONG, f"run_dir={run_dir}"], tmp_path, tag, env)
    try:
        # rank 0 waits for rank 1 in step 30 (its progress says so): the graceful stop can no longer finish
        assert wait_until(lambda: _in_step(run_dir, 0, 30, launch), 60), launch.output
        os.killpg(launch.pid, signal.SIGINT)
        time.sleep(1.0)
        assert launch.proc.poll() is None, launch.output  # still stopping gracefully (torch would wait 30 s)
        second = time.monotonic()
        os.killpg(launch.pid, signal.SIGINT)
        code = launch.wait(timeout=30)
        # the behaviour: killed, not stopped gracefully; the bound only tells it from torch's 30 s shutdown window
        assert code == 128 + signal.SIGINT, launch.output
        assert time.monotonic() - second < 20, launch.output
        assert "again; killed 2 worker(s)" in launch.output
    finally:
        launch.cleanup()


def _in_step(run_dir: Path, rank: int, step: int, launch: Launch) -> bool:
    """``rank``'s progress record (rewritten every second) says it is in ``step``."""
    assert launch.proc.poll() is None, launch.output
    for path in run_dir.glob(f"logs/*/attempt_0/{rank}/mgpu_progress.json"):
        if json.loads(path.read_text() or "{}").get("step") == step:
            return True
    return False


def test_sigkill_of_launch_leaves_no_worker_behind(tmp_path: Path, tag: str):
    run_dir = tmp_path / "run"
    launch = Launch(["--cpu", "--nproc", "2", RECIPE, *LONG, f"run_dir={run_dir}"], tmp_path, tag)
    try:
        wait_for_training(run_dir, launch)
        workers = launch.workers()
        assert len(workers) == 2
        os.kill(launch.pid, signal.SIGKILL)
        launch.proc.wait(timeout=20)
        gone = wait_until(lambda: not tagged(tag), timeout=30, every=0.05)
        assert gone, f"still running 30 s after launch was SIGKILLed: {tagged(tag)}"
    finally:
        launch.cleanup()


@pytest.fixture(scope="module")
def baseline(short_run) -> dict:
    """Final weights of an uninterrupted one-node, two-process run."""
    return final_weights(short_run[0] / "run")


@pytest.mark.parametrize("rendezvous", ["standalone", "static"])
def test_max_restarts_resumes_after_a_one_time_crash_with_the_same_weights(tmp_path: Path, tag: str, baseline,
                                                                           rendezvous: str):
    run_dir = tmp_path / "run"
    env = {"MGPU_FAULT": "crash@rank=1@step=30", "MGPU_FAULT_ONCE": str(tmp_path / "fired")}
    port = ["--master-port", str(free_port())] if rendezvous == "static" else []
    code, launch = run_launch(["--cpu", "--nproc", "2", "--max-restarts", "1", *port, RECIPE, *SHORT,
                               f"run_dir={run_dir}"], tmp_path, tag, env)
    assert code == 0, launch.output
    assert (tmp_path / "fired").exists()  # the crash did happen
    data = json.loads((run_dir / "launch.json").read_text())
    assert [a["attempt"] for a in data["attempts"]] == [0, 1]
    assert "resumed from" in rank0_log(run_dir, attempt=1).read_text()  # from last.pt at step 20, not from scratch
    assert_same_weights(final_weights(run_dir), baseline)


def test_a_failure_that_repeats_is_not_retried(tmp_path: Path, tag: str):
    run_dir = tmp_path / "run"
    env = {"MGPU_FAULT": "crash@rank=1@step=30"}  # every attempt: deterministic
    code, launch = run_launch(["--cpu", "--nproc", "2", "--max-restarts", "3", RECIPE, *SHORT, f"run_dir={run_dir}"],
                              tmp_path, tag, env)
    out = launch.output
    assert code == 1, out
    assert "not restarted: rank 1 failed again with the same RuntimeError at step 30" in out, out
    assert "injected fault: crash at step 30 on rank 1" in out
    data = json.loads((run_dir / "launch.json").read_text())
    assert [a["attempt"] for a in data["attempts"]] == [0, 1]  # 2 of the 4 allowed attempts
    assert "restart_refused" in data["result"]


def test_two_nodes_on_loopback_match_one_node(tmp_path: Path, tag: str, baseline):
    run_dir = tmp_path / "run"
    port = free_port()
    common = ["--cpu", "--nproc", "1", "--nnodes", "2", "--master-addr", "127.0.0.1", "--master-port", str(port)]
    nodes = [Launch([*common, "--node-rank", str(r), RECIPE, *SHORT, f"run_dir={run_dir}"], tmp_path, tag,
                    name=f"node{r}") for r in (0, 1)]
    try:
        codes = [node.wait(timeout=120) for node in nodes]
        assert codes == [0, 0], "\n".join(node.output for node in nodes)
    finally:
        for node in nodes:
            node.cleanup()
    assert (run_dir / "launch.json").is_file() and (run_dir / "launch.node1.json").is_file()
    ids = {json.loads(p.read_text())["rendezvous"]["id"] for p in run_dir.glob("launch*.json")}
    assert len(ids) == 1
    assert_same_weights(final_weights(run_dir), baseline)


def test_worker_watch_fires_when_the_watched_process_exits(tmp_path: Path):
    from mgpucli.launch.parent_watch import watch_pid

    child = subprocess.Popen(["sleep", "60"], start_new_session=True)
    try:
        import threading

        fired = threading.Event()
        watch_pid(child.pid, on_exit=fired.set)
        time.sleep(0.3)
        assert not fired.is_set()
        child.kill()
        assert fired.wait(20)  # at once (a pidfd); the bound only catches a watch that never fires
    finally:
        child.kill()
        child.wait(timeout=5)
    assert proc_state(child.pid) is None


def _has_cuda() -> bool:
    import torch

    return torch.cuda.is_available()


@pytest.mark.gpu
@pytest.mark.skipif(not _has_cuda(), reason="needs a CUDA GPU")
def test_gpu_launch_uses_the_selected_gpus(tmp_path: Path, tag: str):
    import torch

    count = torch.cuda.device_count()
    run_dir = tmp_path / "run"
    code, launch = run_launch([RECIPE, "trainer.epochs=1", f"run_dir={run_dir}", "--gpus", str(count)], tmp_path, tag)
    assert code == 0, launch.output
    data = json.loads((run_dir / "launch.json").read_text())
    assert data["devices"]["kind"] == "cuda" and data["devices"]["nproc_per_node"] == count
    assert f"--nproc-per-node {count} " in data["torchrun"]
    code, launch = run_launch([RECIPE, "--gpus", str(count + 1)], tmp_path, tag, timeout=60)
    assert code == 2 and f"than the {count} visible" in launch.output
