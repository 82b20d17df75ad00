"""``mgpu launch SCRIPT.py``: users' own training scripts under the real CLI, 2 CPU workers with gloo.

The scripts are in ``tests/e2e/scripts`` and are copied into each test's temporary directory, which is the launch's
working directory (so ``runs/`` and ``-m`` work as they do for a user). Processes are tagged and checked as in
tests/e2e/test_launch.py.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from tests.e2e.test_doctor import kill_marked, processes_mentioning
from tests.e2e.test_first_hour import _on_a_terminal
from tests.e2e.test_launch import Launch, run_launch, tagged, wait_until
from tests.procs import free_port, proc_state

SCRIPTS = Path(__file__).parent / "scripts"
CPU2 = ["--cpu", "--nproc", "2"]


@pytest.fixture
def work(tmp_path: Path) -> Path:
    """The launch's working directory, holding a copy of the test scripts (and the trainpkg package)."""
    shutil.copytree(SCRIPTS, tmp_path / "work", ignore=shutil.ignore_patterns("__pycache__"))
    return tmp_path / "work"


def launch_json(run_dir: Path) -> dict:
    return json.loads((run_dir / "launch.json").read_text())


def only_run_dir(work: Path, name: str) -> Path:
    (found,) = list((work / "runs").glob(f"{name}-*"))
    return found


def doctor_json(run_dir: Path, cwd: Path) -> tuple[int, dict]:
    done = subprocess.run([sys.executable, "-m", "mgpucli", "doctor", str(run_dir), "--json"], cwd=cwd,
                          capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL)
    return done.returncode, json.loads(done.stdout)


def rank_files(record: dict) -> dict[str, dict]:
    (attempt,) = record["attempts"]
    return attempt["ranks"]


# ------------------------------------------------------------------------------------------ scripts that train
def test_a_torchrun_style_script_trains_and_gets_every_argument_after_it_untouched(work: Path, tag: str):
    args = ["--epochs", "3", "--cpu", "--nproc", "9", "-m", "x", "--run-dir", "elsewhere", "--", "--gpus=2"]
    code, launch = run_launch([*CPU2, "torchrun_style.py", *args], work, tag)
    assert code == 0, launch.output
    run_dir = only_run_dir(work, "torchrun_style")  # a new run dir named after the script
    assert re.fullmatch(r"torchrun_style-\d{8}-\d{6}", run_dir.name), run_dir
    shown = [json.loads(line.split(":", 1)[1]) for line in launch.output.splitlines() if line.startswith("[rank0]:{")]
    assert [s["rank"] for s in shown] == [0], launch.output  # rank 0's output, live
    assert shown[0]["argv"] == args and shown[0]["world"] == 2
    assert shown[0]["run_dir"] == str(run_dir)  # MGPU_RUN_DIR, absolute
    assert "[rank0]:epoch 1 done" in launch.output
    record = launch_json(run_dir)
    assert record["job"] == "script" and record["script"]["path"] == "torchrun_style.py"
    assert record["script"]["args"] == args and record["result"]["status"] == "succeeded"
    plain = record["torchrun"].split(" torchrun ", 1)[1]  # what a user would type without mgpu
    assert plain.startswith("--nnodes 1 --nproc-per-node 2 ") and "mgpucli" not in plain
    assert plain.endswith("torchrun_style.py --epochs 3 --cpu --nproc 9 -m x --run-dir elsewhere -- --gpus=2")
    assert "CUDA_VISIBLE_DEVICES=''" in record["torchrun"]  # --cpu: the workers see no GPU
    files = rank_files(record)
    assert sorted(files) == ["0", "1"]
    for rank in (0, 1):  # both ranks' output, where launch.json says
        said = json.loads(Path(files[str(rank)]["stdout"]).read_text().splitlines()[0])
        assert said["rank"] == rank and said["argv"] == args
        assert Path(files[str(rank)]["stderr"]).is_relative_to(run_dir / "logs")
    assert not (work / "elsewhere").exists()


def test_the_tutorials_local_rank_script_trains_unmodified_with_local_rank_arg(work: Path, tag: str):
    run_dir = work / "exp1"
    code, launch = run_launch([*CPU2, "--local-rank-arg", "--run-dir", str(run_dir), "tutorial_main.py",
                               "--epochs", "2"], work, tag)
    assert code == 0, launch.output
    assert "tutorial_main.py declares --local_rank" in launch.output
    assert "[rank0]:local_rank 0 epoch 1 loss" in launch.output and "[rank1]:" not in launch.output
    assert (run_dir / "final_weights.pt").is_file()  # rank 0 wrote it into $MGPU_RUN_DIR
    record = launch_json(run_dir)
    assert record["script"]["local_rank_flag"] == "--local_rank"
    files = rank_files(record)
    assert "local_rank 0 epoch 1" in Path(files["0"]["stdout"]).read_text()
    assert Path(files["1"]["stdout"]).is_file() and Path(files["1"]["stderr"]).is_file()


def test_a_module_in_the_current_directory_runs_as_python_m_would(work: Path, tag: str):
    code, launch = run_launch([*CPU2, "-m", "trainpkg.train", "--lr", "1", "--cpu"], work, tag)
    assert code == 0, launch.output
    said = json.loads(next(line for line in launch.output.splitlines() if line.startswith("[rank0]:{")).split(
        ":", 1)[1])
    assert said == {"name": "__main__", "argv0": str(work / "trainpkg" / "train.py"), "args": ["--lr", "1", "--cpu"],
                    "rank": "0", "package": True}
    assert launch_json(only_run_dir(work, "train"))["script"]["module"] == "trainpkg.train"


def test_dry_run_prints_the_plain_torchrun_command_and_bad_targets_are_exit_2(work: Path, tag: str):
    code, launch = run_launch([*CPU2, "--dry-run", "torchrun_style.py", "--lr", "0.1"], work, tag, timeout=60)
    assert code == 0, launch.output
    stdout = launch.out_path.read_text()
    assert stdout.count("torchrun --nnodes 1 --nproc-per-node 2 ") == 1 and "mgpucli" not in stdout
    assert stdout.rstrip().endswith("torchrun_style.py --lr 0.1")
    for target, said in ((["missing.py", "--lr", "1"], "script missing.py does not exist"),
                         (["-m", "nopkg.train"], "no module named 'nopkg'"),
                         (["-m", "trainpkg"], "has no __main__.py")):
        code, launch = run_launch([*CPU2, *target], work, tag, timeout=60, name="bad")
        assert code == 2 and said in launch.output and "Traceback" not in launch.output, launch.output
    code, launch = run_launch([*CPU2, "--resume", "auto", "torchrun_style.py"], work, tag, timeout=60, name="bad")
    assert code == 2 and "--resume is for recipes" in launch.output, launch.output
    assert not (work / "runs").exists()  # nothing started, no run dir


# ------------------------------------------------------------------------------------------ scripts that fail
def test_an_exception_on_rank_1_without_record_is_shown_and_diagnosed(work: Path, tag: str):
    began = time.monotonic()
    code, launch = run_launch([*CPU2, "raise_on_rank1.py"], work, tag, timeout=90)
    took = time.monotonic() - began
    out = launch.output
    assert code == 1, out
    assert took < 60, f"took {took:.0f} s"  # a hang would wait out torch's 30 s teardown or our timeout
    summary = out.split("error: rank 1 failed first", 1)[1]
    assert "ValueError: corrupt sample 17 in shard 2" in summary
    assert 'File "raise_on_rank1.py", line 10, in load_batch' in summary  # the traceback, from the error file
    run_dir = only_run_dir(work, "raise_on_rank1")
    stderr1 = Path(rank_files(launch_json(run_dir))["1"]["stderr"]).read_text()
    assert "Traceback" in stderr1 and "mgpucli" not in stderr1 and "runpy" not in stderr1  # as python prints it
    assert (run_dir / "postmortem.json").is_file()
    doctor_code, report = doctor_json(run_dir, work)
    assert doctor_code == 1, report
    first = report["first_failure"]
    assert first["rank"] == 1 and first["signature"] == "python_exception", first
    assert any("corrupt sample 17" in e["text"] for e in first["evidence"]), first
    assert "recipe" not in first["fix"] and "mgpu train" not in first["fix"]


def test_a_script_that_exits_3_on_every_rank_makes_launch_exit_3(work: Path, tag: str):
    code, launch = run_launch([*CPU2, "exit_code.py", "3"], work, tag)
    assert code == 3, launch.output
    run_dir = only_run_dir(work, "exit_code")
    assert launch_json(run_dir)["result"]["exit_code"] == 3
    _, report = doctor_json(run_dir, work)
    assert report["first_failure"]["signature"] == "script_exit", report


def test_the_legacy_script_without_the_option_is_diagnosed_naming_it(work: Path, tag: str):
    code, launch = run_launch([*CPU2, "tutorial_main.py"], work, tag)
    assert code == 2, launch.output  # argparse's own exit code, on every rank
    assert "the following arguments are required: --local_rank" in launch.output
    assert "--local-rank-arg" in launch.output.split("diagnosis:", 1)[1]
    _, report = doctor_json(only_run_dir(work, "tutorial_main"), work)
    first = report["first_failure"]
    assert first["signature"] == "legacy_local_rank" and "--local-rank-arg" in first["fix"], first
    assert "mgpu launch --local-rank-arg --cpu --nproc 2 tutorial_main.py" in first["fix"]


def test_a_gpu_script_on_cpu_workers_is_told_why_it_fails(work: Path, tag: str):
    code, launch = run_launch([*CPU2, "gpu_style.py"], work, tag)
    assert code == 1, launch.output
    _, report = doctor_json(only_run_dir(work, "gpu_style"), work)
    first = report["first_failure"]
    assert first["signature"] in ("cuda_without_gpus", "nccl_without_gpus"), first
    assert first["fix"].startswith("This launch ran CPU workers (--cpu), which see no GPU"), first


@pytest.mark.gpu
def test_a_gpu_script_runs_on_the_selected_gpu(work: Path, tag: str):
    code, launch = run_launch(["--gpus", "1", "gpu_style.py"], work, tag)  # the first visible GPU
    assert code == 0, launch.output
    said = json.loads(next(line for line in launch.output.splitlines() if line.startswith("[rank0]:{")).split(
        ":", 1)[1])
    assert said == {"rank": 0, "sum": 1.0, "visible": 1}
    assert launch_json(only_run_dir(work, "gpu_style"))["devices"]["cuda_visible_devices"] is not None


def test_a_collective_timeout_names_the_step_each_rank_reached(work: Path, tag: str):
    code, launch = run_launch([*CPU2, "hang_at_step.py"], work, tag, timeout=90)
    assert code == 1, launch.output
    assert "steps each rank had reached (mgpucli.progress): rank 0: 3, rank 1: 2" in launch.output, launch.output
    _, report = doctor_json(only_run_dir(work, "hang_at_step"), work)
    first = report["first_failure"]
    assert first["signature"] == "collective_timeout" and first["step"] == 3, first
    assert first["details"]["late_ranks"] == [1] and first["details"]["rank_steps"] == {"0": 3, "1": 2}
    assert "rank 1 (at step 2) never arrived" in first["title"], first


# ------------------------------------------------------------------------------------ what torchrun never says
def test_a_script_that_exits_0_without_joining_or_training_is_said_to_have_done_nothing(work: Path, tag: str):
    code, launch = run_launch([*CPU2, "too_few_gpus.py"], work, tag, timeout=90)
    assert code == 0, launch.output  # a success for torchrun too: nothing failed
    said = re.search(r"\n  note: the script exited after \d+\.\d s on every rank without joining a process group or "
                     r'training; its last line: "Unable to locate sufficient 2 gpus to run this example\. Exiting\."\n',
                     launch.output)
    assert said, launch.output
    doctor_code, report = doctor_json(only_run_dir(work, "too_few_gpus"), work)
    assert doctor_code == 0 and report["status"] == "succeeded", report
    assert ", but the script exited after" in report["verdict"], report
    assert report["never_trained"].endswith('its last line: "Unable to locate sufficient 2 gpus to run this example. '
                                            'Exiting."'), report


def test_a_rank_that_exits_0_while_another_waits_for_it_is_named_as_the_cause(work: Path, tag: str):
    code, launch = run_launch([*CPU2, "leaves_early.py"], work, tag, timeout=90)
    assert code == 1, launch.output
    barrier = next(i for i, line in enumerate((work / "leaves_early.py").read_text().splitlines(), 1)
                   if line == "dist.barrier()")
    said = (r"error: rank 1 exited with code 0 at \d\d:\d\d:\d\d while rank 0 waited in barrier at "
            rf"leaves_early\.py:{barrier} \(attempt 1 of 1\): rank 1 ended while the others still needed it, so rank 0 "
            r"failed \(exit code 1\) when it lost its connection to it\.")
    assert re.search(said, launch.output), launch.output
    doctor_code, report = doctor_json(only_run_dir(work, "leaves_early"), work)
    first = report["first_failure"]
    assert (doctor_code, first["rank"], first["signature"], first["exit_code"]) == (1, 1, "left_early", 0), report
    assert f"while rank 0 waited in barrier at leaves_early.py:{barrier}" in first["title"], first
    assert [(f["rank"], f["signature"]) for f in report["other_failures"]] == [(0, "peer_lost")], report


def test_a_rank_deaf_to_sigterm_is_killed_within_seconds_of_the_failure_and_never_blamed(work: Path, tag: str):
    code, launch = run_launch([*CPU2, "deaf_to_sigterm.py"], work, tag, timeout=120)
    ended = time.time()
    out = launch.output
    assert code == 1, out
    files = rank_files(launch_json(only_run_dir(work, "deaf_to_sigterm")))
    assert "rank 0 goes on despite SIGTERM" in Path(files["0"]["stdout"]).read_text()  # it got torch's SIGTERM
    assert "mgpu launch: rank(s) 0 still running 5 s after rank 1 failed, despite torch's SIGTERM: killed (SIGKILL)." \
        in out, out
    failed_at = json.loads((Path(files["1"]["error_file"]).parent / "mgpu_failure.json").read_text())["time"]
    assert ended - failed_at < 20, out  # the 5 s grace, not torch's 30 s window
    summary = out[out.index("error: "):]
    assert "error: rank 1 failed first (exit code 1)" in summary and "ValueError: rank one broke" in summary
    assert "also stopped: rank 0 (ended by the teardown with SIGKILL)" in summary
    assert "memory" not in summary and "rank 0 failed" not in summary, summary
    doctor_code, report = doctor_json(only_run_dir(work, "deaf_to_sigterm"), work)
    assert (doctor_code, report["first_failure"]["rank"]) == (1, 1), report
    assert [(f["rank"], f["signature"]) for f in report["other_failures"]] == [(0, "torn_down")], report
    assert "memory" not in json.dumps(report)


def test_a_script_that_spawns_its_own_processes_in_a_job_of_one_rank_gets_them_a_rendezvous(work: Path, tag: str):
    # the DDP tutorial's spawn: each child sets MASTER_ADDR/MASTER_PORT itself (torchrun's agent store would hang it)
    code, launch = run_launch(["--cpu", "--nproc", "1", "tutorial_spawn.py", str(free_port())], work, tag,
                              timeout=120)
    assert code == 0 and "[rank0]:SPAWN-OK 2" in launch.output, launch.output
    assert "without joining a process group" not in launch.output  # its own processes did the work


# ------------------------------------------------------------------------------------------ processes
def test_sigkill_of_launch_leaves_no_process_of_the_job(work: Path, tag: str):
    launch = Launch([*CPU2, "loader_forever.py"], work, tag)
    try:
        assert wait_until(lambda: "loader running" in launch.output or launch.proc.poll() is not None, 90), \
            launch.output
        assert launch.proc.poll() is None, launch.output
        job = [pid for pid in tagged(tag) if pid != launch.pid]
        assert len(job) >= 2 + 2 * 2, job  # 2 workers, each with 2 DataLoader workers
        os.kill(launch.pid, signal.SIGKILL)
        launch.proc.wait(timeout=20)
        assert wait_until(lambda: not tagged(tag), timeout=5, every=0.05), f"left 5 s later: {tagged(tag)}"
    finally:
        launch.cleanup()


def test_ctrl_c_stops_a_script_with_130_and_no_resume_advice(work: Path, tag: str):
    launch = Launch([*CPU2, "loader_forever.py"], work, tag)
    try:
        assert wait_until(lambda: "loader running" in launch.output or launch.proc.poll() is not None, 90), \
            launch.output
        os.killpg(launch.pid, signal.SIGINT)  # what a terminal's Ctrl-C does
        code = launch.wait(timeout=60)
        assert code == 128 + signal.SIGINT, launch.output
        assert "stopped by SIGINT" in launch.output and "--resume" not in launch.output
        assert launch_json(only_run_dir(work, "loader_forever"))["result"]["status"] == "stopped"
    finally:
        launch.cleanup()


def test_on_a_terminal_a_script_shows_its_lines_and_show_rank_all_every_ranks(work: Path, tag: str):
    code, shown = _on_a_terminal([*CPU2, "--show-rank", "all", "torchrun_style.py", "--x"], work, tag)
    assert code == 0, shown
    assert "[rank0]:epoch 1 done" in shown and '[rank1]:{"rank": 1' in shown, shown
    assert "samples/s" not in shown  # no progress bar: a script keeps no progress file


def test_a_second_launch_into_a_run_dir_keeps_the_first_launchs_records(work: Path, tag: str):
    run_dir = work / "exp"
    code, first = run_launch([*CPU2, "--run-dir", str(run_dir), "exit_code.py", "3"], work, tag)
    assert code == 3, first.output
    earlier = launch_json(run_dir)
    code, second = run_launch([*CPU2, "--run-dir", str(run_dir), "torchrun_style.py"], work, tag, name="second")
    assert code == 0, second.output
    assert launch_json(run_dir)["script"]["path"] == "torchrun_style.py"
    assert not (run_dir / "postmortem.json").exists()  # it described the first launch
    kept = run_dir / "logs" / f"launch-{earlier['rendezvous']['id']}"
    assert json.loads((kept / "launch.json").read_text()) == earlier and (kept / "postmortem.json").is_file()


# ------------------------------------------------------------------------------------------ nothing left behind
@pytest.fixture
def marker():
    """A word on the command line of every helper a test's script starts; whatever carries it is killed after. Unique
    to the test (tmp_path's name is not: two xdist workers can give two tests the same one)."""
    word = f"helper-{uuid.uuid4().hex}"
    yield word
    kill_marked(word)


def helpers_of(marker: str) -> list[int]:
    """The helpers' live processes (``MARKER-session-RANK``, ``MARKER-daemon-RANK``, ``MARKER-plain-RANK``; the
    launcher and the workers have the marker alone on their command lines)."""
    return [pid for pid in processes_mentioning(f"{marker}-") if proc_state(pid) not in (None, "Z")]


def start_with_helpers(work: Path, tag: str, marker: str) -> Launch:
    """``mgpu launch`` of leaves_helpers.py, once every rank's three helpers run (a session of their own, a daemon,
    a plain child)."""
    launch = Launch([*CPU2, "leaves_helpers.py", marker, "--wait"], work, tag)
    assert wait_until(lambda: len(helpers_of(marker)) == 6 or launch.proc.poll() is not None, 90), launch.output
    assert launch.proc.poll() is None, launch.output
    return launch


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_helpers_in_their_own_session_or_daemonized_do_not_outlive_a_stopped_job(work: Path, tag: str, marker: str,
                                                                                 sig: int):
    launch = start_with_helpers(work, tag, marker)
    try:
        os.killpg(launch.pid, sig)  # Ctrl-C at a terminal; SIGTERM from a scheduler
        assert launch.wait(timeout=60) == 128 + sig, launch.output
        assert wait_until(lambda: not helpers_of(marker), timeout=30), f"left: {helpers_of(marker)}"
    finally:
        launch.cleanup()


def test_helpers_do_not_outlive_a_sigkilled_launch(work: Path, tag: str, marker: str):
    launch = start_with_helpers(work, tag, marker)
    try:
        os.kill(launch.pid, signal.SIGKILL)
        launch.proc.wait(timeout=20)
        assert wait_until(lambda: not helpers_of(marker), timeout=30), f"left: {helpers_of(marker)}"
    finally:
        launch.cleanup()


@pytest.mark.parametrize("exit_code", [0, 3])
def test_helpers_do_not_outlive_a_job_that_ends_or_fails(work: Path, tag: str, marker: str, exit_code: int):
    launch = Launch([*CPU2, "leaves_helpers.py", marker, "--exit", str(exit_code)], work, tag)
    try:  # checked before the cleanup, which kills whatever carries the test's tag
        assert launch.wait(timeout=120) == exit_code, launch.output
        assert "rank 1: helpers started" in Path(rank_files(launch_json(only_run_dir(work, "leaves_helpers")))["1"][
            "stdout"]).read_text()
        assert wait_until(lambda: not helpers_of(marker), timeout=30), f"left: {helpers_of(marker)}"
    finally:
        launch.cleanup()
