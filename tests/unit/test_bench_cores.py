"""benchmarks/cores.py: which steps count for a round, how sides are named, and (with two small fake jobs that
only sleep) that each job runs on the core it was given, both at once, and the next round swaps them."""

from __future__ import annotations

import argparse
import json
import math
import os
import sys

import pytest

from benchmarks import cores
from benchmarks.cores import overlap, side_spec, window_figures


def test_sides_are_a_b_or_b_with_probe_experiments():
    assert side_spec("A") == ("A", "")
    assert side_spec("A+mgpu-imports") == ("A", "mgpu-imports")
    assert side_spec("B") == ("B", "")
    assert side_spec("A+spin-25") == ("A", "spin-25")
    assert side_spec("A+spin-12.5") == ("A", "spin-12.5")
    assert side_spec("B+no-freeze,plain-loader") == ("B", "no-freeze,plain-loader")
    for bad in ("C", "A+no-freeze", "", "A+spin-", "A+spin-x", "A+xspin-5"):
        with pytest.raises(ValueError, match="A, A\\+mgpu-imports, A\\+spin-US, or B\\+EXPERIMENT"):
            side_spec(bad)


def test_the_hand_written_loop_can_import_what_an_mgpu_worker_imports(monkeypatch):
    """A+mgpu-imports: every module of the list imports (a renamed module fails here, not in a 10-minute run)."""
    import importlib

    from benchmarks import handwritten
    from benchmarks.procinfo import experiments

    monkeypatch.setenv("MGPU_BENCH_EXPERIMENT", "mgpu-imports")
    assert experiments() == {"mgpu-imports"}
    for name in handwritten.MGPU_MODULES:
        assert importlib.import_module(name) is not None


def test_the_hand_written_loop_spins_only_when_asked(monkeypatch):
    """A+spin-US: that many microseconds of busy CPU a step; none without the experiment."""
    from benchmarks import handwritten

    monkeypatch.delenv("MGPU_BENCH_EXPERIMENT", raising=False)
    assert handwritten.spin_seconds() == 0.0
    monkeypatch.setenv("MGPU_BENCH_EXPERIMENT", "spin-25")
    assert handwritten.spin_seconds() == pytest.approx(25e-6)
    monkeypatch.setenv("MGPU_BENCH_EXPERIMENT", "mgpu-imports,spin-12.5")
    assert handwritten.spin_seconds() == pytest.approx(12.5e-6)
    monkeypatch.setenv("MGPU_BENCH_EXPERIMENT", "spin-x")
    with pytest.raises(ValueError, match="'spin-x' is not spin-US"):
        handwritten.spin_seconds()


def _records(start: float, step_s: float, n: int, epoch_every: int = 1000, cpu_s: float = 0.0):
    return [(s, (s - 1) // epoch_every, start + s * step_s, 0.0, s * cpu_s) for s in range(1, n + 1)]


def test_the_window_is_when_every_rank_of_both_jobs_steps():
    steps = [[_records(0.0, 1.0, 20), _records(0.5, 1.0, 20)], [_records(3.0, 1.0, 30)]]
    # last first step: B's at 4.0 (+ settle); first last step: A's rank 0 at 20.0
    assert overlap(steps, settle=0.5) == (4.5, 20.0)
    assert overlap([[_records(0.0, 1.0, 5)], [[]]]) == (math.inf, -math.inf)  # a rank that never stepped


def test_a_round_counts_intervals_inside_the_window_within_one_epoch():
    # steps of 1 s, then of 3 s from step 10; an epoch boundary between steps 6 and 7
    records = [(s, 0 if s <= 6 else 1, float(s) if s <= 10 else 10.0 + 3 * (s - 10), 0.0, 0.002 * s)
               for s in range(1, 14)]
    # window [2, 16]: 2->3 .. 5->6 (1 s), 7->8 .. 9->10 (1 s), 10->11, 11->12 (3 s); 6->7 crosses epochs
    median_step, cpu, n = window_figures([records], 2.0, 16.0)
    assert (median_step, n) == (1.0, 9) and cpu == pytest.approx(0.002)
    assert window_figures([records], 100.0, 200.0)[2] == 0


FAKE_JOB = r"""
import json, os, sys, time
out, records = sys.argv[1], []
for step in range(1, 201):
    time.sleep(0.005)
    records.append((step, 0, time.perf_counter(), time.process_time(), time.thread_time()))
with open(os.path.join(out, "rank0.json"), "w") as fh:
    json.dump({"steps": records, "cores": sorted(os.sched_getaffinity(0))}, fh)
"""


@pytest.mark.skipif(not hasattr(os, "sched_getaffinity") or len(os.sched_getaffinity(0)) < 2,
                    reason="needs 2 cores to give each job its own")
def test_both_jobs_run_at_once_each_on_its_own_core_swapped_every_round(tmp_path):
    # two hand-written jobs (an A/A control, the same side twice) must stay apart
    args = argparse.Namespace(nproc=1, timeout=30.0, epochs=1)  # every wait is bounded by 30 s

    def command(job, workload, args, out):
        return [sys.executable, "-c", FAKE_JOB, str(out)]

    def environment(job, args, out):
        return {"PATH": "/usr/bin:/bin"}

    lines = []
    d = cores.measure("mlp", 2, args, tmp_path, tmp_path, command, environment, lines.append, ("A", "A"))
    assert d["errors"] == [] and len(d["step_ratios"]) == 2, (d["errors"], lines)
    assert all(0.5 < r < 2.0 for r in d["step_ratios"])
    seen = {}
    for path in sorted((tmp_path / "cores-mlp").glob("r*/rank0.json")):
        seen[path.parent.name] = json.loads(path.read_text())["cores"]
    first, second = sorted(os.sched_getaffinity(0))[:2]
    assert seen == {"r00-0A": [first], "r00-1A": [second], "r01-0A": [second], "r01-1A": [first]}
    a, b = (json.loads((tmp_path / "cores-mlp" / f"r00-{s}" / "rank0.json").read_text())["steps"] for s in ("0A", "1A"))
    assert a[0][2] < b[-1][2] and b[0][2] < a[-1][2]  # the two jobs stepped at the same time


def test_a_job_that_fails_is_reported_with_its_log(tmp_path):
    args = argparse.Namespace(nproc=1, timeout=30.0, epochs=1)

    def command(job, workload, args, out):
        return [sys.executable, "-c", "import sys; sys.exit(3)"] if job == "B" else [sys.executable, "-c", FAKE_JOB,
                                                                                    str(out)]

    core = min(os.sched_getaffinity(0))
    pair = cores.run_pair("mlp", 0, ("A", "B"), (core, core), args, tmp_path, tmp_path, command,
                          lambda job, args, out: {"PATH": "/usr/bin:/bin"})
    assert pair.error is not None and pair.error.startswith("B: exit 3, 0 rank files; see ")
    assert pair.error.endswith("output.log")


def test_the_report_shows_both_ratios_with_their_intervals_and_no_verdict():
    from benchmarks.stats import median_interval, spread

    steps, cpu = [1.02, 1.05, 0.99, 1.04, 1.06], [1.1, 1.08, 1.0, 1.12, 1.09]
    d = {"rounds": 5, "sides": ["A", "B"], "epochs": 30, "step_ratios": steps, "cpu_ratios": cpu,
         "step": spread(steps), "step_ci95": median_interval(steps), "cpu": spread(cpu),
         "cpu_ci95": median_interval(cpu), "ms": [3.8, 3.95], "errors": ["round 2: B: exit 1"]}
    lines, data = cores.report("mlp", d, 1.03)
    text = "\n".join(lines)
    assert "| metric | hand-written (A) | mgpu (B) | B/A per round" in text
    assert "| step time, median over the seconds both stepped | 3.800 ms | 3.950 ms | 1.040 " in text
    assert "| training-thread CPU per step | | | 1.090 " in text
    assert "<= 1.03" in text and "no verdict" in text and "ok" not in text.split() and "MISSED" not in text
    assert "round failed: round 2: B: exit 1" in text
    assert data["step"]["median"] == pytest.approx(1.04) and data["target"] == 1.03
    json.dumps(data)  # what overhead.py saves with --json


def test_with_fewer_than_two_usable_cores_it_says_so_and_starts_nothing(tmp_path, monkeypatch):
    monkeypatch.setattr(cores.os, "sched_getaffinity", lambda pid: {3}, raising=False)

    def command(job, workload, args, out):
        raise AssertionError("no job may start")

    d = cores.measure("mlp", 4, argparse.Namespace(nproc=1, timeout=30.0, epochs=1), tmp_path, tmp_path, command,
                      lambda job, args, out: {}, lambda line: None)
    assert d["errors"] == ["needs 2 cores this process may use (one per job); skipped"] and d["step_ratios"] == []
    lines, _ = cores.report("mlp", d, 1.03)
    assert "round failed: needs 2 cores" in "\n".join(lines)
