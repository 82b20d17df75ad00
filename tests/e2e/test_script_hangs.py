"""A script's hang, caught and shown without the script's help: ``mgpu launch SCRIPT.py`` with 2 CPU workers (gloo).

The scripts (``tests/e2e/scripts``) are plain torchrun-style scripts that never call ``mgpucli.progress``: mgpu sees
their progress at torch's public points. Each test bounds the launch well above what it needs, to catch a hang.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.e2e.test_launch import Launch, run_launch, run_side_by_side, wait_until
from tests.procs import mgpu

SCRIPTS = Path(__file__).parent / "scripts"
CPU2 = ["--cpu", "--nproc", "2"]


@pytest.fixture
def work(tmp_path: Path) -> Path:
    for name in ("waits_in_all_reduce.py", "spawns_its_own.py"):
        shutil.copy(SCRIPTS / name, tmp_path / name)
    return tmp_path


def _doctor(work: Path) -> dict:
    done = mgpu("doctor", "run", "--json", cwd=work, timeout=60)
    return json.loads(done.stdout)


def _line(work: Path, script: str, text: str) -> str:
    """``SCRIPT:LINE`` of the script's line holding ``text`` (the script is given by its relative path)."""
    number = next(i for i, line in enumerate((work / script).read_text().splitlines(), 1) if text in line)
    return f"{script}:{number}"


STALLING = ("never_joins.py", "uneven_all_reduce.py")


@pytest.fixture(scope="module")
def stalled(tmp_path_factory) -> dict[str, tuple[Path, str]]:
    """``--stall-s 20`` on each script that hangs, the launches side by side (one 20 s window for both): each ends,
    exit 1; script -> (its working directory, its stderr)."""
    jobs = {}
    for script in STALLING:
        cwd = tmp_path_factory.mktemp(script.removesuffix(".py"))
        shutil.copy(SCRIPTS / script, cwd / script)
        jobs[script] = ([*CPU2, "--stall-s", "20", "--run-dir", "run", script], cwd)
    ended = run_side_by_side(jobs, timeout=90)
    for code, launch in ended.values():
        assert code == 1, launch.output
    return {script: (launch.cwd, launch.err_path.read_text()) for script, (_, launch) in ended.items()}


def test_a_rank_that_never_joins_the_process_group_is_named_with_its_line(stalled):
    work, err = stalled["never_joins.py"]
    assert "rank 1 never joined the process group (rank 0 waits for it in init_process_group): no progress for " \
           "20 s (stall_s=20); the job was stopped." in err, err
    sleep = _line(work, "never_joins.py", "time.sleep(3600)")
    assert f"rank 1 never joined the process group: it was at {sleep} in load_data: time.sleep(3600)" in err, err
    init = _line(work, "never_joins.py", 'init_process_group("gloo")')
    assert f"rank 0 was at {init} in <module>" in err, err
    report = _doctor(work)
    assert report["status"] == "stalled" and report["first_failure"]["rank"] == 1, report
    assert report["first_failure"]["title"].startswith("rank 1 never joined the process group"), report
    assert report["first_failure"]["fix"].startswith("Every rank must reach init_process_group") and \
        "raise --stall-s" in report["first_failure"]["fix"], report
    frame = report["stacks"]["1"]["user_frame"]
    assert (frame["function"], frame["source"]) == ("load_data", "time.sleep(3600)  # a read that never answers")


def test_ranks_that_disagree_on_their_all_reduce_calls_are_both_quoted(stalled):
    work, err = stalled["uneven_all_reduce.py"]
    assert "the ranks wait in different collectives: rank 0 in all_reduce (its call 4), rank 1 in barrier (its " \
           "call 4)" in err, err
    reduce, barrier = (_line(work, "uneven_all_reduce.py", text) for text in ("dist.all_reduce(", "dist.barrier()"))
    assert f"rank 0 waits in all_reduce (its call 4): it was at {reduce} in <module>" in err, err
    assert f"rank 1 waits in barrier (its call 4): it was at {barrier} in <module>" in err, err
    report = _doctor(work)
    assert report["first_failure"]["title"].startswith("the ranks wait in different collectives"), report
    assert "DistributedSampler(..., drop_last=True)" in report["first_failure"]["fix"], report
    assert {r: d["user_frame"]["source"].split("(")[0] for r, d in report["stacks"].items()} == \
        {"0": "dist.all_reduce", "1": "dist.barrier"}


def test_ctrl_c_on_a_job_hung_in_a_collective_shows_where_every_rank_was(work: Path, tag: str):
    launch = Launch([*CPU2, "--run-dir", "run", "waits_in_all_reduce.py"], work, tag)  # no --stall-s
    try:
        def in_all_reduce() -> bool:
            found = list(work.glob("run/logs/*/attempt_0/0/mgpu_progress.json"))
            assert launch.proc.poll() is None, launch.output
            return bool(found) and json.loads(found[0].read_text() or "{}").get("collective") == "all_reduce"

        assert wait_until(in_all_reduce, 60), launch.output  # rank 0 waits for rank 1 in all_reduce
        time.sleep(8)  # still for a while (the launcher names who holds the others up after 5 s)
        os.killpg(launch.pid, signal.SIGINT)  # what a terminal's Ctrl-C does
        code = launch.wait(timeout=60)
    finally:
        launch.cleanup()
    err = launch.err_path.read_text()
    assert code == 128 + signal.SIGINT, launch.output
    sleep = _line(work, "waits_in_all_reduce.py", "time.sleep(3600)")
    assert "rank 1 never entered the all_reduce rank 0 waits in" in err, err
    assert f"rank 1 is outside the all_reduce the others wait in: it was at {sleep} in <module>" in err, err
    assert f"rank 0 was at {_line(work, 'waits_in_all_reduce.py', 'dist.all_reduce(')} in <module>" in err, err
    report = _doctor(work)
    assert report["status"] == "stopped" and "rank 1 never entered the all_reduce" in report["first_failure"]["title"]
    assert report["stacks"]["1"]["user_frame"]["source"] == "time.sleep(3600)  # stuck here", report


def test_a_script_that_spawns_its_own_ranks_is_stopped_with_both_fixes(work: Path, tag: str):
    code, launch = run_launch([*CPU2, "--run-dir", "run", "spawns_its_own.py", "--multiprocessing-distributed"],
                              work, tag, timeout=60)
    err = launch.err_path.read_text()
    assert code == 1, launch.output
    # its DataLoader's worker processes ran: rank 0's own log (torch's tee of it, in the output, can split a line
    # that was written in two pieces: print's "batches:" and " 2", read between the two on a loaded machine)
    (log,) = (work / "run" / "logs").glob("*/attempt_0/0/stdout.log")
    assert "batches: 2" in log.read_text(), launch.output
    assert "NestedLaunchError: the script starts its own distributed processes (torch.multiprocessing.spawn) in " \
           "rank 0 of the 2 that mgpu launch already started" in err, err
    assert "--multiprocessing-distributed" in err and "mgpu launch --nproc 1" in err, err
    report = _doctor(work)
    assert report["first_failure"]["signature"] == "nested_launcher", report
    # the fix it gives works: one mgpu worker, which spawns
    code, launch = run_launch(["--cpu", "--nproc", "1", "--run-dir", "run3", "spawns_its_own.py",
                               "--multiprocessing-distributed"], work, tag, timeout=90, name="one")
    assert code == 0 and launch.output.count("[rank0]:done") == 1, launch.output


def test_init_process_group_in_a_child_of_the_rank_fails_and_stops_the_rank(capsys):
    from mgpucli.launch import nested
    from mgpucli.run_records.nested_launch import ERROR_NAME

    rank = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])  # stands for the launched rank
    try:
        guarded = nested._in_children(lambda **kw: None, rank.pid, 0, 2)  # called here: another process than it
        with pytest.raises(nested.NestedLaunchError, match="a child process of the rank calls init_process_group"):
            guarded(backend="gloo")
        assert rank.wait(timeout=30) == -15  # SIGTERM: the rank does not wait for its child, nor go on alone
        assert f"{ERROR_NAME}: the script starts its own distributed processes" in capsys.readouterr().err
    finally:
        rank.kill()
        rank.wait()
