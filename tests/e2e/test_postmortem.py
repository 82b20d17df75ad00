"""``mgpu doctor RUN_DIR`` on runs that really failed: ``mgpu launch --cpu --nproc 2`` with gloo and the fault hooks.

Each run is short (512 samples, 1 epoch: 8 steps). Every process a test starts carries a unique tag in its
environment; after each test no process with that tag may be left (they are killed by pid if one is).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import time
import uuid
from pathlib import Path

import pytest

from tests.inproc import cli
from tests.procs import assert_usage_error, mgpu
from tests.procs import tagged as tagged_by

REPO = Path(__file__).resolve().parents[2]
RECIPE = str(REPO / "recipes" / "quickstart.yaml")
SMALL = ["data.train.num_samples=512", "data.val.num_samples=101", "trainer.epochs=1", "trainer.log_every=2"]
TAG = "MGPU_POSTMORTEM_TAG"


def tagged(tag: str) -> list[int]:
    return tagged_by(TAG, tag)


@pytest.fixture
def env():
    """A clean environment for one test, tagged; asserts at teardown that nothing carrying the tag survived."""
    tag = uuid.uuid4().hex
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("MGPU_FAULT", "RANK", "WORLD_SIZE",
                                                                        "LOCAL_RANK", "MASTER_", "OMP_NUM"))}
    yield {**clean, TAG: tag}
    deadline = time.monotonic() + 20
    while tagged(tag) and time.monotonic() < deadline:
        time.sleep(0.1)
    left = tagged(tag)
    for pid in left:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    assert not left, f"processes left behind: {left}"


def launch(run_dir: Path, env: dict, *extra: str, faults: dict | None = None, timeout: float = 90):
    return mgpu("launch", "--cpu", "--nproc", "2", RECIPE, *SMALL, f"run_dir={run_dir}", *extra, cwd=REPO,
                env={**env, **(faults or {})}, timeout=timeout)


def doctor(run_dir: Path, env: dict, *args: str):
    """``mgpu doctor RUN_DIR --json``: (exit code, the JSON object on stdout, stderr)."""
    res = mgpu("doctor", str(run_dir), "--json", *args, cwd=REPO, env=env, timeout=60)
    return res.returncode, (json.loads(res.stdout) if res.stdout.strip() else None), res.stderr


def assert_evidence_is_real(first: dict) -> None:
    """Every quoted line is the line at that number in that file (the ``[rankN]:`` prefix aside)."""
    assert first["evidence"], first
    for ev in first["evidence"]:
        if ev["line"] is None:
            continue
        text = Path(ev["file"]).read_text(errors="replace").splitlines()[ev["line"] - 1]
        assert text.rstrip().endswith(ev["text"]), (ev, text)


def test_user_exception_on_rank_1(tmp_path: Path, env: dict):
    run_dir = tmp_path / "run"
    res = launch(run_dir, env, faults={"MGPU_FAULT": "crash@rank=1@step=3"})
    assert res.returncode == 1, res.output
    assert "diagnosis:" in res.stderr and "not a distributed problem" in res.stderr  # launch ends with it
    code, report, err = doctor(run_dir, env)
    assert code == 1 and err == "", err
    first = report["first_failure"]
    assert report["finished"] is False and report["status"] == "failed"
    assert (first["rank"], first["step"], first["signature"]) == (1, 3, "python_exception")
    assert first["evidence"][-1]["text"].strip() == "RuntimeError: injected fault: crash at step 3 on rank 1"
    assert first["details"]["function"] == "maybe_fault" and first["fix"]
    assert_evidence_is_real(first)
    assert [o["rank"] for o in report["other_failures"]] == [0]
    written = json.loads((run_dir / "postmortem.json").read_text())
    assert {k: v for k, v in written.items() if k != "diagnosed_at"} == \
        {k: v for k, v in report.items() if k != "diagnosed_at"}
    human = mgpu("doctor", str(run_dir), cwd=REPO, env=env, timeout=60)  # the same, for a human, on stderr
    assert human.returncode == 1 and human.stdout == ""
    assert "rank 1 failed first at step 3" in " ".join(human.stderr.split()) and "fix:" in human.stderr


def test_nan_loss(tmp_path: Path, env: dict):
    run_dir = tmp_path / "run"
    res = launch(run_dir, env, faults={"MGPU_FAULT": "nan@rank=1@step=3"})
    assert res.returncode == 1, res.output
    assert "NaN or inf at step 3" in res.output  # the run stops naming the step
    assert not (run_dir / "checkpoints" / "last.pt").exists()  # never saved from a NaN state
    code, report, _ = doctor(run_dir, env)
    first = report["first_failure"]
    assert code == 1 and first["signature"] == "nan_loss" and first["step"] == 3
    assert "trainer.clip_grad_norm" in first["fix"] and "optim.lr (now 0.05)" in first["fix"]
    assert_evidence_is_real(first)


def test_sigkill_of_a_worker(tmp_path: Path, env: dict):
    run_dir = tmp_path / "run"
    # Rank 0 SIGKILLs itself while writing the end-of-epoch checkpoint: no exception handler runs.
    assert launch(run_dir, env, faults={"MGPU_FAULT": "kill_in_save@rank=0"}).returncode == 1
    code, report, _ = doctor(run_dir, env)
    first = report["first_failure"]
    assert code == 1 and first["rank"] == 0 and first["signature"] == "killed_by_signal"
    assert first["details"]["signal"] in ("SIGKILL", None)  # None: the launcher did not record exit codes
    assert "out-of-memory killer" in first["title"] and "dmesg" in first["fix"]
    assert first["step"] == 8  # the last step logged before the save (8 steps per epoch)


def test_collective_timeout(tmp_path: Path, env: dict):
    run_dir = tmp_path / "run"
    # Rank 1 is held inside step 3 until the teardown's SIGTERM (or 300 s); rank 0 waits in DDP's gradient
    # all-reduce with a 4 s timeout.
    res = launch(run_dir, env, "trainer.timeout_s=4",
                 faults={"MGPU_FAULT": "hold_step@rank=1@step=3", "MGPU_FAULT_SLEEP": "300"})
    assert res.returncode == 1, res.output
    code, report, _ = doctor(run_dir, env)
    first = report["first_failure"]
    assert code == 1 and first["signature"] == "collective_timeout" and first["rank"] == 0, first
    assert first["details"]["late_ranks"] == [1] and first["details"]["waiting_ranks"] == [0]
    assert "backward" in first["details"]["collective"] and first["details"]["timeout_s"] == 4
    assert "trainer.timeout_s (now 4)" in first["fix"]
    assert first["step"] in (2, 3)  # 3 when the worker recorded it; else the last logged step (2)


PORT_GRABBER = """
import os
import socket

from mgpucli.components.datasets import SyntheticClassification


class Listening(SyntheticClassification):
    \"\"\"A dataset that serves something on a port, as some data services do: every rank binds HELD_PORT.\"\"\"

    def __init__(self, **kwargs):
        self.server = socket.socket()
        self.server.bind(("127.0.0.1", int(os.environ["HELD_PORT"])))
        super().__init__(**kwargs)
"""


def test_port_in_use(tmp_path: Path, env: dict):
    # Deterministic: the test holds a port, and every rank's dataset tries to listen on it. Every rank refuses its
    # dataset (exit 2), or is ended by the teardown before it could (which the launcher counts as the same); had only
    # rank 0 bound it, the exit would depend on whether rank 1 got past its dataset before the teardown (1) or not (2).
    (tmp_path / "portgrab.py").write_text(PORT_GRABBER)
    run_dir = tmp_path / "run"
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen(1)
        port = held.getsockname()[1]
        res = mgpu("launch", "--cpu", "--nproc", "2", RECIPE, *SMALL, f"run_dir={run_dir}",
                   "data.train._target_=portgrab.Listening", cwd=tmp_path, env={**env, "HELD_PORT": str(port)},
                   timeout=90)
    assert res.returncode == 2, res.output
    code, report, _ = doctor(run_dir, env)
    first = report["first_failure"]
    assert code == 1 and first["signature"] == "address_in_use" and first["rank"] in (0, 1), report
    assert "Address already in use" in json.dumps(first["evidence"])
    assert "Another process was already listening" in first["fix"]


def test_a_finished_run_and_a_path_that_is_not_a_run_dir(tmp_path: Path, env: dict):
    run_dir = tmp_path / "run"
    assert launch(run_dir, env).returncode == 0
    code, report, _ = doctor(run_dir, env)
    assert code == 0 and report["finished"] is True and report["first_failure"] is None
    assert report["last_metrics"]["val"]["step"] == 8
    # the refusals need no process (tests.inproc.cli fails a command that starts one):
    refused = cli("doctor", str(tmp_path), "--json", cwd=REPO)  # a directory, but no launch.json
    assert_usage_error(refused, "not a run directory")
    assert refused.stdout == ""
    # no directory at all (as a launch refused before it made one leaves it: tests/e2e/test_launch.py's
    # test_bad_input_is_exit_2_before_any_process launches on a busy --master-port)
    refused = cli("doctor", str(tmp_path / "never-made"), "--json", cwd=REPO)
    assert_usage_error(refused, "no such directory")
    assert refused.stdout == ""
    assert_usage_error(cli("doctor", str(run_dir), "--quick", cwd=REPO), "--quick")  # machine-check options


def test_the_post_mortem_needs_neither_the_launcher_nor_torch(tmp_path: Path, blocked_imports):
    """A run dir as `mgpu launch` leaves it after rank 1 raised, read with mgpucli.launch and torch unimportable."""
    from mgpucli.run_records.json_files import write_json
    from mgpucli.run_records.launch_record import build_attempt
    from mgpucli.run_records.worker_records import FailureRecord, record_path, write_record

    run_dir = tmp_path / "run"
    files = {}
    for local_rank in (0, 1):
        folder = run_dir / "logs" / "job_x" / "attempt_0" / str(local_rank)
        folder.mkdir(parents=True)
        files[local_rank] = {name: str(folder / name) for name in ("stdout.log", "stderr.log", "error.json")}
        Path(files[local_rank]["stdout.log"]).write_text("")
    Path(files[0]["stderr.log"]).write_text("RuntimeError: Connection closed by peer [127.0.0.1]:1234\n")
    Path(files[1]["stderr.log"]).write_text(
        'Traceback (most recent call last):\n  File "train.py", line 3, in <module>\n    boom()\n'
        "ValueError: bad batch at step 5\n")
    write_record(record_path(files[1]["error.json"]), FailureRecord(1, 1, 0, 100.0, "ValueError", "bad batch", 5, 1))
    by_rank = {name: {r: f[name] for r, f in files.items()} for name in ("stdout.log", "stderr.log", "error.json")}
    attempt = build_attempt(0, {r: {"RANK": str(r)} for r in files}, *by_rank.values())
    write_json(str(run_dir / "launch.json"), {
        "argv": ["mgpu", "launch", "--cpu", "--nproc", "2", "r.yaml"], "run_dir": str(run_dir), "nnodes": 1,
        "devices": {"kind": "cpu", "nproc_per_node": 2}, "attempts": [attempt.to_json()],
        "result": {"status": "failed", "exit_code": 1, "first_failed_rank": 1, "exitcodes": {"0": 1, "1": 1}}})
    code, report, err = doctor(run_dir, {**os.environ, **blocked_imports("mgpucli.launch", "mgpucli.engine")})
    assert code == 1 and "must not be imported" not in err, err
    first = report["first_failure"]
    assert (first["rank"], first["step"], first["signature"]) == (1, 5, "python_exception"), first
