"""The launcher's exit watch, its pure parts (files, no processes): a worker's code, and whether it failed."""

from __future__ import annotations

import os
from pathlib import Path
from types import SimpleNamespace

from mgpucli.launch import exit_watch
from mgpucli.launch.exit_watch import ExitWatch
from mgpucli.run_records.launch_record import LaunchRecord, RankExit, build_attempt
from mgpucli.run_records.worker_records import FailureRecord, record_path, write_record


def test_a_code_is_torchs_convention():
    assert exit_watch._exit_code(SimpleNamespace(si_code=os.CLD_EXITED, si_status=3)) == 3
    assert exit_watch._exit_code(SimpleNamespace(si_code=os.CLD_KILLED, si_status=9)) == -9
    assert exit_watch._exit_code(SimpleNamespace(si_code=os.CLD_DUMPED, si_status=6)) == -6
    assert exit_watch._exit_code(None) is None  # reaped by the agent before the watch read it


def test_a_code_the_watch_lost_to_the_agents_poll_is_the_one_the_worker_recorded(tmp_path: Path):
    errs = {lr: str(tmp_path / "attempt_0" / str(lr) / "error.json") for lr in (0, 1)}
    record = LaunchRecord(str(tmp_path / "launch.json"), {})
    record.add_attempt(build_attempt(0, {lr: {"RANK": str(lr)} for lr in errs}, {}, {}, errs))
    watch = ExitWatch(record, stopping=lambda: False)
    assert watch._failed(0, 1, RankExit(1, 10.0)) and not watch._failed(0, 1, RankExit(0, 10.0))
    assert not watch._failed(0, 1, RankExit(75, 10.0))  # a graceful stop: the others are finishing it too
    assert not watch._failed(0, 1, RankExit(None, 10.0))  # nothing recorded: nothing to go on
    Path(errs[1]).parent.mkdir(parents=True)
    write_record(record_path(errs[1]), FailureRecord(1, 1, 0, 9.5, "ValueError", "broke", None, 1))
    assert watch._failed(0, 1, RankExit(None, 10.0))
