"""The stall watch's rule: a rank whose step and phase stay the same for stall_s is stalled; of several, the one
behind and outside a collective (it holds the others in their next collective)."""

from __future__ import annotations

import json

from mgpucli.launch.stall_watch import StallWatch
from mgpucli.run_records.launch_record import Attempt, LaunchRecord, RankFiles
from mgpucli.run_records.worker_records import progress_path


def _watch(tmp_path, stall_s=10.0):
    record = LaunchRecord(str(tmp_path / "launch.json"), {})
    ranks = {}
    for rank in (0, 1):
        folder = tmp_path / "attempt_0" / str(rank)
        folder.mkdir(parents=True)
        ranks[rank] = RankFiles(rank, rank, "", "", str(folder / "error.json"))
    record.add_attempt(Attempt(0, str(tmp_path / "attempt_0"), ranks))
    return StallWatch(record, stall_s, stop_workers=lambda: None), ranks


def _progress(files, step, phase):
    with open(progress_path(files.error_file), "w") as fh:
        json.dump({"step": step, "phase": phase, "time": 0.0}, fh)


def test_a_rank_is_stalled_only_after_stall_s_without_a_change(tmp_path):
    watch, ranks = _watch(tmp_path)
    _progress(ranks[0], 5, "forward")
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


def test_a_rank_that_never_wrote_progress_is_never_judged(tmp_path):
    watch, _ = _watch(tmp_path)
    assert watch.check(now=0.0) is None and watch.check(now=1000.0) is None
