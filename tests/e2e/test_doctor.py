"""``mgpu doctor`` end to end: real subprocesses, the real launcher, real gloo collectives on CPU.

Every doctor run gets its own TMPDIR (the live test's files live there, so the path shows up on the command
line of the launcher and of every worker); after each run we assert that no process carrying that path is
left, and kill any that is (and its group) in ``finally``.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from mgpucli import proctree
from tests.inproc import cli
from tests.procs import assert_usage_error

ROOT = Path(__file__).resolve().parents[2]
STALE = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "MGPU_FAULT",
         "CUDA_VISIBLE_DEVICES", "OMP_NUM_THREADS")  # fmt: skip


def processes_mentioning(marker: str) -> list[int]:
    """Pids whose command line contains ``marker`` (Linux /proc)."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                if marker.encode() in f.read():
                    found.append(int(entry))
        except OSError:
            continue
    return found


def kill_marked(marker: str) -> None:
    for pid in processes_mentioning(marker):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(os.getpgid(pid), signal.SIGKILL)
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGKILL)


def doctor(tmp_path: Path, *args: str, env: dict[str, str] | None = None, timeout: float = 120):
    """Run ``python -m mgpucli doctor ARGS``; returns (returncode, stdout, stderr, seconds)."""
    tmpdir = tmp_path / "doctor-tmp"
    tmpdir.mkdir(exist_ok=True)
    full_env = {k: v for k, v in os.environ.items() if k not in STALE}
    full_env.update(env or {})
    full_env["TMPDIR"] = str(tmpdir)
    start = time.monotonic()
    proc = proctree.start([sys.executable, "-m", "mgpucli", "doctor", *args], cwd=ROOT, env=full_env,
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        out, err = proc.communicate(timeout=timeout)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        left = processes_mentioning(str(tmpdir))
        kill_marked(str(tmpdir))
    assert left == [], f"processes left behind: {left}"
    return proc.returncode, out, err, time.monotonic() - start


def checks(stdout: str) -> dict[str, dict]:
    data = json.loads(stdout)  # the whole of stdout is one JSON object
    assert set(data) >= {"checks", "verdict"}
    return {c["name"]: c for c in data["checks"]}


def assert_flagged(check: dict, *needles: str) -> None:
    assert check["status"] in ("warn", "fail"), check
    assert check["hint"], check
    for needle in needles:
        assert needle in check["detail"] + check["hint"], (needle, check)


def test_cpu_live_test_runs_for_real(tmp_path):
    rc, out, err, _ = doctor(tmp_path, "--cpu", "--nproc", "2", "--json")
    data = json.loads(out)
    by_name = checks(out)
    for name in ("live test", "all_reduce", "broadcast", "all_gather", "all_reduce bandwidth"):
        assert by_name[name]["status"] == "ok", by_name[name]
    assert "2 processes, gloo on CPU" in by_name["live test"]["detail"]
    assert by_name["gloo"]["status"] == "ok"
    rows = data["bandwidth"]
    assert [r["bytes"] for r in rows] == [65536, 1048576, 8388608]
    assert all(r["algbw_gbps"] > 0 and r["busbw_gbps"] == pytest.approx(r["algbw_gbps"]) for r in rows)  # n=2
    failed = [c for c in data["checks"] if c["status"] == "fail"]
    assert rc == (1 if failed else 0), (rc, failed)
    assert data["status"] == ("fail" if failed else data["status"])
    assert "Traceback" not in err


def test_broken_environment_is_reported_with_fixes(tmp_path):
    with socket.socket() as holder:  # a port some other program holds
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        env = {"CUDA_VISIBLE_DEVICES": "abc", "RANK": "3", "WORLD_SIZE": "2", "MASTER_PORT": str(port)}
        rc, out, _, _ = doctor(tmp_path, "--json", env=env)
    by_name = checks(out)
    assert_flagged(by_name["CUDA_VISIBLE_DEVICES"], "'abc'", "unset CUDA_VISIBLE_DEVICES")
    assert_flagged(by_name["rank variables"], "RANK=3 does not fit WORLD_SIZE=2", "unset RANK WORLD_SIZE MASTER_PORT")
    assert by_name["rank variables"]["status"] == "fail"
    assert_flagged(by_name["MASTER_PORT"], f"MASTER_PORT={port} is already in use", "unset MASTER_PORT")
    assert by_name["MASTER_PORT"]["status"] == "fail"
    assert rc == 1
    # The stale variables are the user's shell's problem; the live test itself runs clean of them.
    assert by_name["live test"]["status"] == "ok", by_name["live test"]


def test_hung_live_test_fails_within_the_timeout(tmp_path):
    # 30 s: both ranks must start and reach the collective within it, which took over 8 s on a loaded 2-core
    # machine; rank 1's fault sleeps for an hour.
    rc, out, _, seconds = doctor(
        tmp_path, "--cpu", "--nproc", "2", "--json", "--timeout", "30", env={"MGPU_FAULT": "sleep@rank=1"}
    )
    by_name = checks(out)
    live = by_name["live test"]
    assert live["status"] == "fail" and "did not finish within 30 s" in live["detail"], live
    assert "rank 1 in all_reduce" in live["detail"] and live["hint"]
    assert by_name["all_reduce"]["status"] == "skipped"
    assert rc == 1
    assert seconds < 30 + 20  # the timeout, plus the torch probe and start-up on a busy 2-core machine


def test_crashing_worker_fails_with_its_error(tmp_path):
    rc, out, _, _ = doctor(tmp_path, "--cpu", "--nproc", "2", "--json", env={"MGPU_FAULT": "crash@rank=1"})
    live = checks(out)["live test"]
    assert live["status"] == "fail" and "injected fault" in live["detail"], live
    assert rc == 1


def test_wrong_collective_values_fail(tmp_path):
    rc, out, _, _ = doctor(tmp_path, "--cpu", "--nproc", "2", "--json", env={"MGPU_FAULT": "nan@rank=1"})
    by_name = checks(out)
    assert by_name["all_reduce"]["status"] == "fail" and "values wrong" in by_name["all_reduce"]["detail"]
    assert by_name["broadcast"]["status"] == "ok" and by_name["all_gather"]["status"] == "ok"
    assert rc == 1


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--cpu", "--gpus", "1"], "--cpu and --gpus exclude each other"),
        (["--nproc", "2"], "--nproc sets the number of CPU processes and needs --cpu"),
        (["--gpus", "two"], "is not a GPU count"),
        (["--cpu", "--nproc", "2", "--timeout", "0"], "--timeout 0"),
    ],
)
def test_bad_options_exit_2(tmp_path, args, message):
    """Refused before any probe starts: in the test process (``tests.inproc.cli`` fails a command that starts one)."""
    r = cli("doctor", *args, "--json", cwd=tmp_path)
    assert_usage_error(r, message)
    assert r.stdout == ""


def test_a_bad_option_is_exit_2_through_the_console_script(tmp_path):
    rc, out, err, _ = doctor(tmp_path, "--cpu", "--nproc", "2", "--timeout", "0", "--json")
    assert rc == 2
    assert "--timeout 0" in err and "Traceback" not in err
    assert out == ""


def test_human_output_is_a_table_and_a_verdict_on_stderr(tmp_path):
    rc, out, err, _ = doctor(tmp_path, "--cpu", "--nproc", "2", "--quick")
    assert out == ""
    for text in ("software", "rank setup", "distributed env", "host", "live test", "skipped with --quick"):
        assert text in err
    last = err.strip().splitlines()[-1]
    assert last.startswith(("ready for 2 CPU processes (gloo)", "not ready:"))
    assert rc in (0, 1)


def test_the_doctor_process_never_imports_torch_nor_a_tracker(tmp_path):
    code = (
        "import sys\n"
        "import mgpucli.cli.app\n"
        "assert 'torch' not in sys.modules, 'the CLI imported torch'\n"
        "from mgpucli.doctor.examine import DoctorOptions, run_doctor\n"
        "report = run_doctor(DoctorOptions(quick=True))\n"
        "assert report.checks and 'torch' not in sys.modules, 'the doctor imported torch'\n"
        "assert not {'wandb', 'mlflow'} & set(sys.modules), 'the doctor imported a tracker'\n"
        "assert {'W&B', 'MLflow'} <= {c.name for c in report.checks}\n"
        "print('clean')\n"
    )
    env = {k: v for k, v in os.environ.items() if k not in STALE}
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "clean"


def _cuda_available() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return torch.cuda.is_available()


@pytest.mark.gpu
@pytest.mark.skipif(not _cuda_available(), reason="needs a CUDA GPU")
def test_gpu_live_test_with_nccl(tmp_path):
    rc, out, _, _ = doctor(tmp_path, "--json")
    by_name = checks(out)
    assert by_name["NCCL"]["status"] == "ok"
    assert by_name["live test"]["status"] == "ok", by_name["live test"]
    assert "nccl on GPUs" in by_name["live test"]["detail"]
    assert by_name["all_reduce"]["status"] == "ok"


def fake_nvidia_smi(tmp_path: Path, body: str) -> dict[str, str]:
    """A PATH whose first entry holds an ``nvidia-smi`` running ``body`` (Python; argv as nvidia-smi's)."""
    bindir = tmp_path / "fake-bin"
    bindir.mkdir()
    script = bindir / "nvidia-smi"
    script.write_text(f"#!{sys.executable}\nimport sys, time\n{body}\n")
    script.chmod(0o755)
    return {"PATH": f"{bindir}{os.pathsep}{os.environ.get('PATH', '')}"}


def test_a_hung_nvidia_smi_is_a_failed_check_not_a_hang(tmp_path):
    env = fake_nvidia_smi(tmp_path, "time.sleep(600)")
    rc, out, _, seconds = doctor(tmp_path, "--quick", "--json", "--timeout", "3", env=env)
    driver = checks(out)["CUDA driver"]
    assert driver["status"] == "fail" and "did not answer within 3 s" in driver["detail"], driver
    assert "dmesg" in driver["hint"]
    assert rc == 1 and seconds < 3 + 20
    assert processes_mentioning(str(tmp_path / "fake-bin")) == []


SMI_QUERY = """\
0, NVIDIA A100-SXM4-80GB, GPU-aaaa1111-0000-0000-0000-000000000000, 00000000:07:00.0, 81920, 3, 0, Default, 550.54.15
1, NVIDIA A100-SXM4-80GB, GPU-bbbb2222-0000-0000-0000-000000000000, 00000000:0F:00.0, 81920, 40000, 88, Default, 550.54.15
"""  # noqa: E501


def test_gpus_seen_by_nvidia_smi_but_torch_is_a_cpu_build(tmp_path):
    """The nvidia-smi path end to end, on a CPU-only torch: the doctor names the wrong wheel and the busy GPU."""
    body = (
        f"QUERY = {SMI_QUERY!r}\n"
        "if any(a.startswith('--query-gpu') for a in sys.argv[1:]):\n"
        "    print(QUERY, end='')\n"
        "elif sys.argv[1:2] == ['topo']:\n"
        "    print('\\tGPU0\\tGPU1\\tCPU Affinity\\nGPU0\\t X \\tNV12\\t0-63\\nGPU1\\tNV12\\t X \\t0-63')\n"
        "else:\n"
        "    print('| NVIDIA-SMI 550.54.15    Driver Version: 550.54.15    CUDA Version: 12.4 |')\n"
    )
    rc, out, _, _ = doctor(tmp_path, "--quick", "--json", env=fake_nvidia_smi(tmp_path, body))
    by_name = checks(out)
    build = by_name["torch CUDA build"]
    assert build["status"] == "fail" and "2 NVIDIA GPU(s)" in build["detail"] and "whl/cu" in build["hint"]
    assert by_name["CUDA driver"]["detail"].startswith("driver 550.54.15, supports CUDA up to 12.4")
    assert by_name["GPUs in use"]["status"] == "warn" and "GPU 1" in by_name["GPUs in use"]["detail"]
    assert by_name["GPUs"]["status"] == "warn"  # torch sees none; a CPU run is still checked
    assert rc == 1
