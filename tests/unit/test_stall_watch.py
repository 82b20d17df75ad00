"""The stall watch's rule: a rank whose progress stays the same for stall_s is stalled; of several, the one that
wrote none, then the one behind and outside a collective (it holds the others in their next collective). Under the
default limit, CPU work counts as progress."""

from __future__ import annotations

import json

from mgpucli.launch.stall_watch import StallWatch
from mgpucli.run_records.launch_record import Attempt, LaunchRecord, RankFiles
from mgpucli.run_records.worker_records import progress_path


def _watch(tmp_path, stall_s=10.0, busy_share=None):
    record = LaunchRecord(str(tmp_path / "launch.json"), {})
    ranks = {}
    for rank in (0, 1):
        folder = tmp_path / "attempt_0" / str(rank)
        folder.mkdir(parents=True)
        ranks[rank] = RankFiles(rank, rank, "", "", str(folder / "error.json"))
    record.add_attempt(Attempt(0, str(tmp_path / "attempt_0"), ranks))
    return StallWatch(record, stall_s, stop_workers=lambda: None, busy_share=busy_share), ranks


def _progress(files, step, phase, **more):
    with open(progress_path(files.error_file), "w") as fh:
        json.dump({"step": step, "phase": phase, "time": 0.0, **more}, fh)


def test_a_rank_is_stalled_only_after_stall_s_without_a_change(tmp_path):
    watch, ranks = _watch(tmp_path)
    _progress(ranks[0], 5, "forward")
    _progress(ranks[1], 9, "ended")  # done: never judged
    assert watch.check(now=100.0) is None
    _progress(ranks[0], 6, "forward")
    assert watch.check(now=105.0) is None  # it moved: the clock starts again
    assert watch.check(now=114.0) is None
    found = watch.check(now=115.5)
    assert (found.rank, found.step, found.phase) == (0, 6, "forward") and found.seconds == 10.5


def test_of_several_stalled_ranks_the_one_behind_outside_a_collective_is_named(tmp_path):
    watch, ranks = _watch(tmp_path)
    _progress(ranks[0], 7, "backward (gradient all-reduce)")
    _progress(ranks[1], 6, "loading a batch")
    watch.check(now=0.0)
    found = watch.check(now=20.0)
    assert (found.rank, found.step, found.phase) == (1, 6, "loading a batch")


def test_a_rank_that_never_wrote_progress_is_judged_from_when_another_did(tmp_path):
    watch, ranks = _watch(tmp_path)
    assert watch.check(now=0.0) is None and watch.check(now=1000.0) is None  # nothing started yet
    _progress(ranks[0], 0, "script", joined=False, collective="init_process_group", calls=1, optimizer_steps=0)
    assert watch.check(now=1001.0) is None
    found = watch.check(now=1011.0)
    assert found.rank == 1 and found.progress is None and "it wrote no progress" in found.describe(10)


def test_under_the_default_cpu_work_counts_as_progress(tmp_path):
    watch, ranks = _watch(tmp_path, stall_s=100.0, busy_share=0.1)
    _progress(ranks[1], 3, "ended")
    _progress(ranks[0], 1, "validation", cpu_s=0.0)
    assert watch.check(now=0.0) is None
    _progress(ranks[0], 1, "validation", cpu_s=10.0)  # a tenth of the limit in CPU time: busy, not stuck
    assert watch.check(now=90.0) is None
    _progress(ranks[0], 1, "validation", cpu_s=15.0)  # then (nearly) idle: stalled a limit after it last worked
    assert watch.check(now=189.0) is None
    assert watch.check(now=190.0).rank == 0


def test_a_given_limit_judges_progress_alone(tmp_path):
    watch, ranks = _watch(tmp_path, stall_s=100.0)
    _progress(ranks[1], 3, "ended")
    _progress(ranks[0], 1, "validation", cpu_s=0.0)
    assert watch.check(now=0.0) is None
    _progress(ranks[0], 1, "validation", cpu_s=99.0)
    assert watch.check(now=100.0).rank == 0
