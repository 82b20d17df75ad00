"""The launcher's exit watch on real processes (children of the test, as workers are of the launcher); its pure
parts are in tests/unit/test_exit_watch.py."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

from mgpucli import env_vars, procfs
from mgpucli.launch.exit_watch import ExitWatch
from mgpucli.run_records.launch_record import LaunchRecord, build_attempt
from tests.procs import TAG, wait_until


def test_a_worker_that_ended_before_the_watch_found_it_has_no_recorded_end(tmp_path: Path, tag: str):
    """Real processes, children of this one as workers are of the launcher: rank 1 ends before the watch starts (a
    finished process cannot be told for a worker: nothing is recorded of it, torch reports its code), rank 0 is killed
    by SIGTERM while watched (recorded, with its signal). first_to_fail counts on the first."""
    errs = {lr: str(tmp_path / "attempt_0" / str(lr) / "error.json") for lr in (0, 1)}
    record = LaunchRecord(str(tmp_path / "launch.json"), {})
    record.add_attempt(build_attempt(0, {lr: {"RANK": str(lr)} for lr in errs}, {}, {}, errs))

    def worker(rank: int, code: str) -> subprocess.Popen:
        env = {**os.environ, env_vars.ERROR_FILE: errs[rank], TAG: tag}
        return subprocess.Popen([sys.executable, "-c", code], env=env, start_new_session=True)

    early = worker(1, "raise SystemExit(2)")
    late = worker(0, "import time; time.sleep(60)")
    watch = ExitWatch(record, stopping=lambda: True)  # as while the launcher is stopped: no grace timer
    try:
        assert wait_until(lambda: (procfs.state_and_parent(early.pid) or ("",))[0] == "Z", timeout=30)
        watch.start()
        assert wait_until(lambda: len(watch._pidfds) == 1, timeout=30)
        late.terminate()
        assert wait_until(lambda: 0 in watch._exits.get(0, {}), timeout=30)
    finally:
        late.kill()
        watch.finish()
        early.wait(timeout=30)
        late.wait(timeout=30)
    exits = record.attempts[0].exits
    assert sorted(exits) == [0] and exits[0].code == -signal.SIGTERM, exits
