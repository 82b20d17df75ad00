"""benchmarks/interleaved.py: which steps count for a slice, how slices pair, and (with two small fake jobs
that only sleep) that a frozen job really stops and its steps never fall in the other job's slices."""

from __future__ import annotations

import argparse
import json
import sys

from benchmarks import interleaved
from benchmarks.interleaved import paired_slice_ratios, slice_medians


def test_a_slice_counts_the_steps_that_started_and_ended_inside_it_after_the_first_few():
    # one rank, steps of 1 s, then of 2 s from t=10; epoch changes between steps 8 and 9
    records = [(s, 0 if s <= 8 else 1, float(s) if s <= 10 else 10.0 + 2 * (s - 10)) for s in range(1, 16)]
    steps = {"A": [records], "B": [records]}
    # slice [2.5, 9.5]: steps ending 4..9 start inside; 8->9 crosses the epoch; skip 1 -> 4->5 .. 7->8: 1 s each
    assert slice_medians([("A", 2.5, 9.5)], steps, skip=1) == [("A", 1.0)]
    # [10, 20]: 10->11 .. 14->15 (2 s each); a slice with fewer than 3 steps is left out
    assert slice_medians([("B", 10.0, 20.0), ("A", 0.5, 3.2)], steps, skip=0) == [("B", 2.0)]


def test_slices_pair_in_alternating_order():
    medians = [("B", 2.0), ("A", 1.0), ("B", 3.0), ("A", 6.0), ("B", 12.0), ("A", 4.0), ("B", 8.0)]
    assert paired_slice_ratios(medians) == [2.0, 2.0]  # (B2, A1), then (A6, B12): B first, then A first
    medians = [("A", 1.0), ("A", 9.0), ("B", 2.0), ("B", 7.0), ("A", 3.0), ("A", 4.0), ("B", 6.0)]
    # a slice left out (too few steps) can leave two of one job together: the pair starts at the next switch
    assert paired_slice_ratios(medians) == [2.0 / 9.0, 6.0 / 4.0]  # (A9, B2), then (A4, B6)


FAKE_JOB = r"""
import json, os, sys, time
out, records = sys.argv[1], []
for step in range(1, 161):
    time.sleep(0.01)
    records.append((step, 0, time.perf_counter(), 0.0, 0.0))
with open(os.path.join(out, "rank0.json"), "w") as fh:
    json.dump({"steps": records}, fh)
"""


def test_frozen_jobs_take_turns_and_each_steps_only_in_its_own_slices(tmp_path, monkeypatch):
    monkeypatch.setattr(interleaved, "SETTLE_S", 0.3)
    monkeypatch.setitem(interleaved.EPOCHS, "mlp", 1)
    args = argparse.Namespace(slice=0.15, nproc=1, timeout=30.0, epochs=None)  # every wait is bounded by 30 s

    def command(side, workload, args, out):
        return [sys.executable, "-c", FAKE_JOB, str(out)]

    def environment(side, args, out):
        return {"PATH": "/usr/bin:/bin"}

    s = interleaved.run_session("mlp", 0, args, tmp_path, tmp_path, command, environment)
    assert s.error is None, s.error
    assert len(s.slices) >= 6 and [side for side, _, _ in s.slices[:4]] == ["B", "A", "B", "A"]
    for side, other in (("A", "B"), ("B", "A")):
        theirs = [(start, end) for sd, start, end in s.slices if sd == other]
        times = [t for _, _, t in s.steps[side][0]]
        # a step finished while the other job had the machine only if it was frozen mid-sleep and woke at
        # the switch: none may finish well inside the other job's slice
        inside = [t for t in times for start, end in theirs if start + 0.05 < t < end - 0.01]
        assert inside == [], (side, inside[:5])
    medians = slice_medians(s.slices, s.steps, skip=1)
    assert medians and all(0.009 < m < 0.05 for _, m in medians)
    assert paired_slice_ratios(medians)
    assert json.loads((tmp_path / "interleaved-mlp" / "s00-A" / "rank0.json").read_text())["steps"]
