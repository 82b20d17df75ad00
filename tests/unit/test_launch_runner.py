"""The runner's hooks into torch's agent, driven directly (no processes started)."""

from __future__ import annotations

import json
import signal
from pathlib import Path

import pytest
from torch.distributed.elastic.multiprocessing import SignalException
from torch.distributed.elastic.multiprocessing.api import Std

from mgpucli.launch import runner
from mgpucli.launch.main import record_header
from mgpucli.launch.plan import LaunchOptions, Machine, RecipeFacts, build_plan
from mgpucli.run_records.launch_record import LaunchRecord
from mgpucli.run_records.worker_records import FailureRecord, record_path, write_record
from mgpucli.stop_signals import SignalCount


def make_record(tmp_path: Path) -> LaunchRecord:
    opts = LaunchOptions(recipe="r.yaml", cpu=True, nproc=2, max_restarts=3)
    plan = build_plan(opts, RecipeFacts(run_dir=str(tmp_path / "run")), Machine(0, 4, "box", {}),
                      port_check=lambda p: None)
    return LaunchRecord(plan.launch_json, record_header(plan, opts, argv=["launch"]))


def envs(attempt: int) -> dict[int, dict[str, str]]:
    return {lr: {"RANK": str(lr), "TORCHELASTIC_RUN_ID": "job", "TORCHELASTIC_RESTART_COUNT": str(attempt)}
            for lr in range(2)}


def fail(dest, local_rank: int, attempt: int, step: int | None = 30, retryable: bool = True) -> None:
    write_record(record_path(dest.error_files[local_rank]),
                 FailureRecord(local_rank, local_rank, attempt, 1.0 + attempt, "RuntimeError",
                               f"crash at step {step}", step, 1, retryable))


def specs(tmp_path: Path, record: LaunchRecord) -> runner.IndexingLogsSpecs:
    return runner.IndexingLogsSpecs(record, log_dir=str(tmp_path / "logs"), redirects=Std.ALL,
                                    tee=Std.from_str("0:3"))


def test_every_attempt_is_indexed_in_torchs_layout(tmp_path: Path):
    record = make_record(tmp_path)
    dest = specs(tmp_path, record).reify(envs(0))
    assert Path(dest.stderrs[1]).parent.name == "1" and Path(dest.stderrs[1]).parent.parent.name == "attempt_0"
    assert dest.tee_stdouts == {0: dest.stdouts[0]}  # rank 0 alone is tee'd to the terminal
    data = json.loads(Path(record.path).read_text())
    assert data["attempts"][0]["ranks"]["1"]["stderr"] == dest.stderrs[1]


def test_a_transient_failure_is_restarted_a_repeat_is_refused(tmp_path: Path):
    record = make_record(tmp_path)
    logs = specs(tmp_path, record)
    first = logs.reify(envs(0))
    fail(first, 1, attempt=0)
    second = logs.reify(envs(1))  # one failure: restart allowed
    assert "attempt_1" in second.error_files[0]
    fail(second, 1, attempt=1)  # the same exception at the same step again
    with pytest.raises(runner.RestartRefused) as info:
        logs.reify(envs(2))
    assert info.value.failed_attempt == 1 and "same RuntimeError at step 30" in info.value.reason
    assert not list((tmp_path / "logs").glob("*/attempt_2"))  # refused before anything of attempt 2 existed


def test_a_different_step_is_restarted_and_non_retryable_is_refused_at_once(tmp_path: Path):
    record = make_record(tmp_path)
    logs = specs(tmp_path, record)
    fail(logs.reify(envs(0)), 1, attempt=0, step=30)
    fail(logs.reify(envs(1)), 1, attempt=1, step=45)
    nan = logs.reify(envs(2))  # a different step: may be transient
    fail(nan, 0, attempt=2, step=50, retryable=False)
    with pytest.raises(runner.RestartRefused):
        logs.reify(envs(3))


def test_every_attempt_records_the_nodes_that_met_and_where_each_keeps_its_record(tmp_path: Path, monkeypatch):
    from mgpucli.launch import rendezvous_watch
    from mgpucli.launch.node_presence import Member

    monkeypatch.setattr(rendezvous_watch, "_rounds", [])
    members = [Member("box", 41), Member("box", 42)]
    rendezvous_watch._note_round(0, [], members, False, ("launch.box-aaaaaa.json", "launch.box-bbbbbb.json"))
    record = make_record(tmp_path)
    specs(tmp_path, record).reify(envs(0))
    assert record.attempts[0].to_json()["nodes"] == [
        {"node": "box (pid 41)", "host": "box", "pid": 41, "record": "launch.box-aaaaaa.json"},
        {"node": "box (pid 42)", "host": "box", "pid": 42, "record": "launch.box-bbbbbb.json"}]


def test_a_launch_refused_while_the_agent_met_its_rendezvous_starts_no_worker(tmp_path: Path):
    """The recipe's check refused before torch's agent got to start the workers: it starts none, records none."""
    from mgpucli.launch.gate import Gate

    record = make_record(tmp_path)
    gate = Gate()
    try:
        gate.begin(lambda: (_ for _ in ()).throw(ValueError("optim.lrr")), lambda: None)
        gate.refused()
        logs = runner.IndexingLogsSpecs(record, gate, log_dir=str(tmp_path / "logs"), redirects=Std.ALL,
                                        tee=Std.from_str("0:3"))
        with pytest.raises(runner.LaunchRefused):
            logs.reify(envs(0))
    finally:
        gate.close()
    assert record.attempts == [] and not list((tmp_path / "logs").rglob("attempt_0"))


class Clock:
    """Seconds that pass only when a test says so."""

    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_first_signal_is_torchs_graceful_path_second_kills(monkeypatch, tmp_path):
    killed = []
    monkeypatch.setattr(runner, "kill_children", lambda: killed.append(True) or [123])
    handler = runner._Signals(LaunchRecord(str(tmp_path / "launch.json"), {}))  # no worker started yet
    handler._handle(signal.SIGINT, None)  # before/after the agent runs: nothing raised into launch's own code
    assert killed == [True]
    killed.clear()
    clock = Clock()
    handler = runner._Signals(LaunchRecord(str(tmp_path / "launch.json"), {}), SignalCount(clock))
    handler.active = True
    with pytest.raises(SignalException) as info:
        handler._handle(signal.SIGINT, None)
    assert info.value.sigval == signal.SIGINT and not killed
    clock.now += 1.0  # a person's second Ctrl-C
    handler._handle(signal.SIGINT, None)  # no exception: the agent's shutdown wait sees the workers gone
    assert killed == [True] and handler.stacks_asked is None


def test_the_first_signal_delivered_twice_at_once_is_one_signal(monkeypatch, tmp_path):
    """GNU timeout forwards one SIGINT to the launcher and to its process group: two deliveries, milliseconds apart."""
    killed = []
    monkeypatch.setattr(runner, "kill_children", lambda: killed.append(True) or [123])
    clock = Clock()
    handler = runner._Signals(LaunchRecord(str(tmp_path / "launch.json"), {}), SignalCount(clock))
    handler.active = True
    with pytest.raises(SignalException):
        handler._handle(signal.SIGINT, None)
    clock.now += 0.003
    handler._handle(signal.SIGINT, None)  # the same one: neither a second graceful stop nor a kill
    assert killed == [] and handler.received == [signal.SIGINT]


def test_the_first_signal_asks_every_rank_for_its_stacks_before_the_graceful_path(monkeypatch, tmp_path):
    from mgpucli.run_records.launch_record import Attempt, RankFiles

    record = LaunchRecord(str(tmp_path / "launch.json"), {})
    record.add_attempt(Attempt(0, str(tmp_path), {r: RankFiles(r, r, "", "", f"/x/{r}/error.json") for r in (0, 1)}))
    asked = []
    monkeypatch.setattr(runner.stacks, "request_live", lambda files: asked.append(sorted(files)) or [])
    handler = runner._Signals(record)
    handler.active = True
    with pytest.raises(SignalException):
        handler._handle(signal.SIGTERM, None)
    assert asked == [["/x/0/error.json", "/x/1/error.json"]] and handler.stacks_asked is not None


def test_signals_left_to_torch():
    assert runner._signals_for_torch("SIGTERM,SIGINT,SIGHUP,SIGQUIT") == "SIGHUP,SIGQUIT"
    assert runner._signals_for_torch("SIGTERM,SIGINT,SIGHUP,SIGQUIT,SIGUSR1") == "SIGHUP,SIGQUIT,SIGUSR1"
