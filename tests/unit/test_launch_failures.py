"""The failure summary, the launch.json index and the port check (files, no processes)."""

from __future__ import annotations

import json
import signal
import socket
import time
from pathlib import Path

import pytest

from mgpucli.errors import UsageError
from mgpucli.launch.failure_summary import summarize
from mgpucli.launch.main import record_header
from mgpucli.launch.plan import LaunchOptions, Machine, RecipeFacts, build_plan
from mgpucli.launch.ports import ephemeral_range, free_port, port_problem, require_free_port
from mgpucli.run_records.first_failure import (
    TEARDOWN_CATEGORY,
    all_refused,
    collect,
    early_exit,
    first_to_fail,
    job_exit_code,
    preempted,
    stopped_gracefully,
    torn_down,
)
from mgpucli.run_records.launch_record import LaunchRecord, build_attempt, filter_env
from mgpucli.run_records.worker_records import FailureRecord, record_path, write_record

TRACE = (
    "Traceback (most recent call last):\n"
    '  File "/x/trainer.py", line 240, in _forward_backward\n'
    "    if self._faults and faults.maybe_fault(...):\n"
    "                        ^^^^^^^^^^^^^^^^^^^^^^^^\n"
    "RuntimeError: injected fault: crash at step 30 on rank 1\n"
)


def make_attempt(tmp_path: Path, nranks: int = 2):
    envs = {lr: {"RANK": str(lr)} for lr in range(nranks)}
    base = tmp_path / "logs" / "job_x" / "attempt_0"
    outs, errs, efs = {}, {}, {}
    for lr in range(nranks):
        (base / str(lr)).mkdir(parents=True)
        outs[lr], errs[lr], efs[lr] = (str(base / str(lr) / n) for n in ("stdout.log", "stderr.log", "error.json"))
    return build_attempt(0, envs, outs, errs, efs)


def torch_error_file(path: str, message: str, trace: str, stamp: int) -> None:
    Path(path).write_text(json.dumps({"message": {"message": message,
                                                  "extraInfo": {"py_callstack": trace, "timestamp": str(stamp)}}}))


def test_attempt_index_by_global_rank(tmp_path: Path):
    envs = {0: {"RANK": "2"}, 1: {"RANK": "3"}}  # node 1 of a two-node job
    attempt = build_attempt(1, envs, {0: "/l/a/0/stdout.log"}, {}, {0: "/l/a/0/error.json", 1: "/l/a/1/error.json"})
    assert sorted(attempt.ranks) == [2, 3]
    assert attempt.ranks[2].local_rank == 0 and attempt.ranks[3].local_rank == 1
    assert attempt.dir == "/l/a"
    assert attempt.to_json()["ranks"]["3"]["error_file"] == "/l/a/1/error.json"


def test_sigkilled_rank_is_named_before_its_peers_echo(tmp_path: Path):
    attempt = make_attempt(tmp_path)
    # rank 0 noticed first in wall-clock terms, with a gloo error caused by rank 1's death
    torch_error_file(attempt.ranks[0].error_file, "RuntimeError: [gloo] Connection closed by peer", "tb", 100)
    found = collect(attempt, {0: 1, 1: -signal.SIGKILL})
    assert [f.rank for f in found] == [1, 0]
    text = summarize(found, attempt, 1, "runs/q/launch.json")
    assert text.startswith("rank 1 failed first (killed by SIGKILL) in attempt 1 of 1.")
    assert "also stopped: rank 0 (exit code 1)" in text


def test_exception_first_then_agent_teardown(tmp_path: Path):
    attempt = make_attempt(tmp_path)
    torch_error_file(attempt.ranks[1].error_file, "RuntimeError: injected fault: crash at step 30 on rank 1",
                     TRACE, 200)
    Path(attempt.ranks[1].stderr).write_text(
        "[rank1]:loading data\n[rank1]:about to fail\n" + "".join(f"[rank1]:{line}\n" for line in TRACE.splitlines())
    )
    found = collect(attempt, {0: -signal.SIGTERM, 1: 1})
    assert [f.rank for f in found] == [1, 0]
    text = summarize(found, attempt, 2, "launch.json")
    assert "rank 1 failed first (exit code 1) in attempt 1 of 2." in text
    assert "RuntimeError: injected fault: crash at step 30 on rank 1" in text
    assert 'File "/x/trainer.py", line 240' in text and "^^^^" not in text
    assert "[rank1]:about to fail" in text  # the log's own context...
    assert text.count('File "/x/trainer.py"') == 1  # ...without the traceback a second time
    assert "rank 0 (killed by SIGTERM)" in text


def test_earliest_of_two_genuine_errors_wins(tmp_path: Path):
    attempt = make_attempt(tmp_path)
    for rank, t in ((0, 5.5), (1, 5.2)):
        error_file = attempt.ranks[rank].error_file
        Path(error_file).write_text("{}")
        write_record(record_path(error_file), FailureRecord(rank, rank, 0, t, "ValueError", f"bad {rank}", 3, 1))
    assert [f.rank for f in collect(attempt, {0: 1, 1: 1})] == [1, 0]


def test_without_exit_codes_only_ranks_that_left_an_error_count(tmp_path: Path):
    attempt = make_attempt(tmp_path)
    write_record(record_path(attempt.ranks[1].error_file),
                 FailureRecord(1, 1, 0, 1.0, "RuntimeError", "boom", 30, 1))
    found = collect(attempt)
    assert [f.rank for f in found] == [1]
    assert found[0].message == "RuntimeError: boom"


@pytest.mark.parametrize(("codes", "recorded", "refused"), [
    ({0: 2, 1: 2}, {}, True),
    ({0: 2, 1: -signal.SIGTERM}, {1: 2}, True),  # rank 1 was exiting 2 too when the agent's SIGTERM came
    ({0: -signal.SIGTERM, 1: 2}, {0: 2}, True),
    ({0: 2, 1: -signal.SIGTERM}, {}, False),  # rank 1 had not failed: the input was bad for rank 0 only
    ({0: 2, 1: -signal.SIGTERM}, {1: 1}, False),
    ({0: 2, 1: 1}, {}, False),
    ({0: 2, 1: -signal.SIGKILL}, {1: 2}, False),
])
def test_bad_input_stays_bad_input_when_the_agent_stopped_a_rank_on_its_way_out(tmp_path: Path, codes, recorded,
                                                                                   refused):
    """Once one rank exited with exit code 2, torch's agent SIGTERMs the others, which may not have exited yet."""
    attempt = make_attempt(tmp_path)
    for rank, code in recorded.items():
        write_record(record_path(attempt.ranks[rank].error_file),
                     FailureRecord(rank, rank, 0, 1.0, "CheckpointError", "does not fit", None, code, False))
    Path(attempt.ranks[0].stderr).write_text("error: [rank 0] checkpoint does not fit\nFix: pass another one\n")
    found = collect(attempt, codes)
    assert all_refused(found) is refused
    text = summarize(found, attempt, 1, "launch.json")
    assert text.startswith("every rank stopped on bad input") is refused
    if refused:  # rank 0 said it in full, whichever rank exited first
        assert [f.rank for f in found] == [0, 1]
        assert "rank 0 said:" in text and "Fix: pass another one" in text


def test_summary_when_nothing_was_recorded(tmp_path: Path):
    attempt = make_attempt(tmp_path)
    assert "no rank left an error" in summarize([], attempt, 1, "launch.json")


def test_filter_env_keeps_what_matters_and_never_secrets():
    env = {"CUDA_VISIBLE_DEVICES": "0", "NCCL_DEBUG": "INFO", "OMP_NUM_THREADS": "4", "MASTER_ADDR": "h",
           "SLURM_JOB_ID": "1", "TORCH_HUB_TOKEN": "s3cret", "HOME": "/root", "AWS_SECRET_ACCESS_KEY": "x",
           "PATH": "/bin", "MGPU_RUN_DIR": "runs/q", "MY_VAR": "1", "NCCL_PASSWORD": "p"}
    kept = filter_env(env, extra=["MY_VAR"])
    assert kept == {"CUDA_VISIBLE_DEVICES": "0", "NCCL_DEBUG": "INFO", "OMP_NUM_THREADS": "4",
                    "MASTER_ADDR": "h", "SLURM_JOB_ID": "1", "MGPU_RUN_DIR": "runs/q", "MY_VAR": "1"}


def test_launch_record_is_written_whole(tmp_path: Path):
    facts = RecipeFacts(run_dir=str(tmp_path / "run"))
    opts = LaunchOptions(recipe="r.yaml", cpu=True, nproc=2)
    plan = build_plan(opts, facts, Machine(0, 4, "box", {}), port_check=lambda p: None)
    record = LaunchRecord(plan.launch_json, record_header(plan, opts, argv=["launch", "--cpu"]))
    record.set_env({"OMP_NUM_THREADS": "2", "HOME": "/root"}, plan.env)
    record.add_attempt(make_attempt(tmp_path))
    record.set_result("succeeded", 0)
    record.write()
    data = json.loads(Path(plan.launch_json).read_text())
    assert data["torchrun"] == plan.command() and data["argv"] == ["mgpu", "launch", "--cpu"]
    assert data["attempts"][0]["ranks"]["1"]["local_rank"] == 1
    assert "HOME" not in data["env"] and data["result"]["status"] == "succeeded"
    assert [p.name for p in Path(plan.launch_json).parent.iterdir()] == ["launch.json"]  # no temp file left


def test_port_check_sees_a_listener():
    with socket.socket() as sock:
        sock.bind(("0.0.0.0", 0))
        sock.listen(1)
        port = sock.getsockname()[1]
        assert "in use" in (port_problem(port) or "")
        with pytest.raises(UsageError) as info:
            require_free_port(port, "--master-port")
        assert f"--master-port {port}" in str(info.value)
    assert port_problem(port) is None


def test_a_picked_port_is_free_and_below_the_kernels_own_picks_skipping_a_busy_one():
    low = ephemeral_range()[0]
    assert 1024 < low <= 65535
    assert all(20000 <= free_port() < low and port_problem(free_port()) is None for _ in range(5))
    with socket.socket() as sock:
        sock.bind(("0.0.0.0", 0))
        sock.listen(1)
        busy = sock.getsockname()[1]
        free = free_port()
        offered = iter([busy, free])
        assert free_port(lambda lo, hi: next(offered)) == free  # the listener's port is passed over


def test_with_nothing_free_below_the_range_the_kernel_picks(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setattr("mgpucli.launch.ports.port_problem", lambda port: "already in use")
    port = free_port()
    assert port >= ephemeral_range()[0]


def test_preempted_only_when_every_recorded_rank_stopped_with_a_checkpoint(tmp_path: Path):
    attempt = make_attempt(tmp_path)
    assert preempted(attempt) == []
    for rank in (0, 1):
        write_record(record_path(attempt.ranks[rank].error_file),
                     FailureRecord(rank, rank, 0, 1.0, "Preempted", "stopped by SIGTERM at step 80", 80, 75, False))
    assert [r.rank for r in preempted(attempt)] == [0, 1]
    write_record(record_path(attempt.ranks[1].error_file),
                 FailureRecord(1, 1, 0, 1.0, "RuntimeError", "boom", 80, 1))
    assert preempted(attempt) == []


# ---------------------------------------------------------------------- what the launcher saw of each worker's end
def ended(attempt, **exits) -> None:
    """``attempt.exits`` as the launcher's exit watch records them: rank -> (code, time)."""
    from mgpucli.run_records.launch_record import RankExit

    for name, (code, when) in exits.items():
        attempt.exits[int(name.removeprefix("r"))] = RankExit(code, when)


def test_the_agents_sigkill_after_a_rank_failed_is_the_teardown_not_the_cause(tmp_path: Path):
    """The issue's run: rank 1 raised; rank 0, busy in its dataset, was SIGKILLed 30 s later by torch's agent."""
    attempt = make_attempt(tmp_path)
    torch_error_file(attempt.ranks[1].error_file, "ValueError: rank one dataset broke", TRACE, 100)
    ended(attempt, r1=(1, 100.4), r0=(-signal.SIGKILL, 130.5))
    found = collect(attempt, {1: 1, 0: -signal.SIGKILL})
    assert [(f.rank, f.torn_down) for f in found] == [(1, False), (0, True)]
    text = summarize(found, attempt, 1, "launch.json")
    assert text.startswith("rank 1 failed first (exit code 1) in attempt 1 of 1.")
    assert "also stopped: rank 0 (ended by the teardown with SIGKILL)" in text
    assert "OOM" not in text and "memory" not in text


def test_without_exit_times_a_sigkill_still_comes_first(tmp_path: Path):
    """Records of a launcher that did not see the workers end (no pidfd): the old order, a SIGKILL is a cause."""
    attempt = make_attempt(tmp_path)
    torch_error_file(attempt.ranks[1].error_file, "ValueError: rank one dataset broke", TRACE, 100)
    assert [f.rank for f in collect(attempt, {1: 1, 0: -signal.SIGKILL})] == [0, 1]


def test_a_sigterm_from_outside_that_ended_a_rank_first_is_the_cause(tmp_path: Path):
    """A script rank killed by someone's SIGTERM: its peer's lost connection and the teardown come after it."""
    attempt = make_attempt(tmp_path, nranks=3)
    torch_error_file(attempt.ranks[0].error_file, "RuntimeError: [gloo] Connection closed by peer", "tb", 50)
    ended(attempt, r1=(-signal.SIGTERM, 50.0), r0=(1, 50.2), r2=(-signal.SIGTERM, 50.3))
    found = collect(attempt, {0: 1, 1: -signal.SIGTERM, 2: -signal.SIGTERM})
    assert [(f.rank, f.category) for f in found] == [(1, 0), (0, 3), (2, TEARDOWN_CATEGORY)]
    assert torn_down(attempt) == {2} and first_to_fail(attempt) == 1


def test_a_rank_that_failed_before_the_watch_found_it_comes_before_the_teardown(tmp_path: Path):
    """A script that fails in its first moments on a busy host: rank 1 exited 3 before the launcher's watch found it,
    so only torch reports it; rank 0, seen ending by the agent's SIGTERM, was torn down, and the launch passes on 3."""
    attempt = make_attempt(tmp_path)
    ended(attempt, r0=(-signal.SIGTERM, 30.6))
    exitcodes = {1: 3, 0: -signal.SIGTERM}
    assert first_to_fail(attempt, exitcodes) == 1 and torn_down(attempt, exitcodes) == {0}
    found = collect(attempt, exitcodes)
    assert [(f.rank, f.torn_down) for f in found] == [(1, False), (0, True)]
    assert job_exit_code(found) == 3


def test_a_refusal_said_by_one_rank_comes_before_a_rank_the_teardown_stopped_first(tmp_path: Path):
    """The legacy script without --local_rank: rank 1's argparse exited 2, and torch's SIGTERM ended rank 0 before it
    had said the same. Every rank stopped on bad input, and the one that said it is the one shown, its code passed
    on; when both said it, rank 0 is shown (which of them exited first is chance)."""
    attempt = make_attempt(tmp_path)
    ended(attempt, r1=(2, 40.61), r0=(-signal.SIGTERM, 40.64))
    found = collect(attempt, {1: 2, 0: -signal.SIGTERM})
    assert all_refused(found)
    assert [(f.rank, f.torn_down) for f in found] == [(1, False), (0, True)]
    assert job_exit_code(found) == 2
    ended(attempt, r0=(2, 40.64))
    assert [f.rank for f in collect(attempt, {1: 2, 0: 2})] == [0, 1]


def test_a_code_the_watch_could_not_read_is_torchs(tmp_path: Path):
    attempt = make_attempt(tmp_path)
    ended(attempt, r1=(None, 10.0), r0=(-signal.SIGTERM, 10.2))  # rank 1 reaped by the agent first
    assert torn_down(attempt) == set()
    assert torn_down(attempt, {1: 1, 0: -signal.SIGTERM}) == {0}


def test_a_graceful_stop_whose_last_rank_the_teardown_ended_is_still_preempted(tmp_path: Path):
    attempt = make_attempt(tmp_path)
    ended(attempt, r1=(75, 20.0), r0=(-signal.SIGTERM, 20.1))  # rank 0 was on its way out of the same stop
    found = collect(attempt, {1: 75, 0: -signal.SIGTERM})
    assert stopped_gracefully(found)
    ended(attempt, r0=(1, 20.1))  # rank 0 failed of its own
    assert not stopped_gracefully(collect(attempt, {1: 75, 0: 1}))


TRACE_IN_BARRIER = (
    "Traceback (most recent call last):\n"
    '  File "main.py", line 14, in <module>\n'
    "    dist.barrier()\n"
    '  File "/v/lib/python3.11/site-packages/torch/distributed/c10d_logger.py", line 83, in wrapper\n'
    "    return func(*args, **kwargs)\n"
    '  File "/v/lib/python3.11/site-packages/torch/distributed/distributed_c10d.py", line 5356, in barrier\n'
    "    work.wait()\n"
    "RuntimeError: [gloo] Connection closed by peer [127.0.0.1]:21644\n"
)


def test_a_rank_that_exited_0_while_another_waited_for_it_is_named(tmp_path: Path):
    attempt = make_attempt(tmp_path)
    torch_error_file(attempt.ranks[0].error_file, "RuntimeError: [gloo] Connection closed by peer", TRACE_IN_BARRIER,
                     101)
    when = time.mktime((2026, 1, 2, 12, 1, 3, 0, 0, -1))
    ended(attempt, r1=(0, when), r0=(1, when + 0.3))
    found = collect(attempt, {0: 1})
    left = early_exit(attempt, found)
    assert left is not None and left.describe() == ("rank 1 exited with code 0 at 12:01:03 while rank 0 waited in "
                                                    "barrier at main.py:14")
    text = summarize(found, attempt, 1, "launch.json")
    assert text.startswith("rank 1 exited with code 0 at 12:01:03 while rank 0 waited in barrier at main.py:14 "
                           "(attempt 1 of 1): rank 1 ended while the others still needed it, so rank 0 failed (exit "
                           "code 1) when it lost its connection to it.")
    ended(attempt, r1=(None, when))  # its code lost to the agent's poll: torch reported no failure for it, so 0
    assert early_exit(attempt, collect(attempt, {0: 1})) == left
    # not when the rank that failed had an error of its own, nor when the other rank ended after it
    torch_error_file(attempt.ranks[0].error_file, "ValueError: bad", "tb", 101)
    assert early_exit(attempt, collect(attempt, {0: 1})) is None
    torch_error_file(attempt.ranks[0].error_file, "RuntimeError: [gloo] Connection closed by peer", "tb", 101)
    ended(attempt, r1=(0, when + 1))
    assert early_exit(attempt, collect(attempt, {0: 1})) is None


def test_bad_input_on_one_rank_while_the_teardown_ended_the_other_still_building(tmp_path: Path):
    """Rank 0 refused its input (exit 2); rank 1, still building the same datasets, was SIGTERMed by the teardown
    after it and recorded nothing: the job's own failure is bad input (exit 2). Killed before rank 0 failed, it
    would have been a failure of its own."""
    for rank1_ended_at, refused in ((2.0, True), (0.5, False)):
        attempt = make_attempt(tmp_path / str(refused))
        ended(attempt, r0=(2, 1.0), r1=(-signal.SIGTERM, rank1_ended_at))
        Path(attempt.ranks[0].stderr).write_text("error: [rank 0] 1 problem(s) in recipe r.yaml\n")
        assert all_refused(collect(attempt, {0: 2, 1: -signal.SIGTERM})) is refused
