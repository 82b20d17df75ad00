"""benchmarks/overhead.py's pure parts: the commands both sides run, start-up phases, the hot-path audit summary."""

from __future__ import annotations

from pathlib import Path

from benchmarks.overhead import Run, command, environment, parse_args, startup_phases, summarise_audit


def test_cpu_commands_run_the_same_workload_on_both_sides():
    args = parse_args(["--nproc", "2"])
    a, b = command("A", "mlp", args, Path("/o")), command("B", "mlp", args, Path("/o"))
    assert a[1:4] == ["--standalone", "--nproc-per-node", "2"] and a[-4:] == ["--workload", "mlp", "--epochs", "10"]
    assert b[1:5] == ["launch", "--cpu", "--nproc", "2"] and b[-2:] == ["run_dir=/o/run", "trainer.epochs=10"]
    env_a, env_b = environment("A", args, Path("/o")), environment("B", args, Path("/o"))
    assert env_a["OMP_NUM_THREADS"] == env_b["OMP_NUM_THREADS"]  # the same intra-op threads on both sides
    assert env_b["PYTHONPATH"].split(":")[0].endswith("probe") and "probe" not in env_a["PYTHONPATH"]


def test_gpu_commands_run_one_process_per_gpu_on_both_sides():
    args = parse_args(["--gpus", "4"])
    a, b = command("A", "charlm", args, Path("/o")), command("B", "charlm", args, Path("/o"))
    assert a[1:4] == ["--standalone", "--nproc-per-node", "4"] and b[1:4] == ["launch", "--gpus", "4"]
    assert environment("A", args, Path("/o"))["MGPU_BENCH_DEVICE"] == "cuda"


def test_startup_phases_between_milestones():
    info = {"started_at": 10.5, "first_step_at": 14.0,
            "marks": {"imports done": 12.0, "process group": 12.5, "model wrapped": 13.5}}
    late = dict(info, started_at=10.7)
    phases = startup_phases(10.0, [info, late])
    assert [round(v, 2) for v in phases.values()] == [0.7, 1.3, 0.5, 1.0, 0.5]
    assert startup_phases(10.0, [{"started_at": None}]) == {}


def test_audit_counts_only_what_happens_outside_the_log_interval():
    # the all-reduce starts at each log step (5, 10, ...) and is read, one host sync, at the step after
    rows = [(s, 1 if s % 5 == 1 and s > 1 else 0, 1 if s % 5 == 0 else 0, 100 if s % 5 == 0 else -1)
            for s in range(1, 31)]
    run = Run("B", "mlp", 0, 0, 1.0, 0.0, audit=[{"per_step": rows, "cuda_sync_warnings": 0}])
    facts = summarise_audit(run, log_every=5, warmup=0)
    assert facts["host_syncs_outside_log_interval"] == [] and facts["collectives_per_log_interval"] == [1]
    assert facts["collectives_outside_log_interval"] == [] and facts["live_objects_growth_per_step"] == [0.0]
    rows[2] = (3, 1, 0, -1)  # a sync at step 3: neither a log step nor the one after
    rows[4] = (5, 1, 1, 100)  # nor at the log step itself: the all-reduce is not waited for there
    assert summarise_audit(run, log_every=5, warmup=0)["host_syncs_outside_log_interval"] == [3, 5]


def test_time_sliced_diagnostic_carries_no_verdict():
    """--interleaved is a diagnostic: even a ratio far over the target must not read as MISSED (main() exits 1
    on any MISSED verdict in the results)."""
    from benchmarks.overhead import report_interleaved
    from benchmarks.stats import median_interval, spread

    ratios = [1.20, 1.25, 1.30, 1.22, 1.28]
    sliced = {"sessions": 1, "epochs": 10, "slice_s": 0.25, "A_ms": 1.0, "B_ms": 1.25, "errors": [],
              "ratio": spread(ratios), "ci95": median_interval(ratios)}
    lines, data = report_interleaved("mlp", sliced)
    assert "verdict" not in data and data["target"] == 1.03
    text = "\n".join(lines)
    assert "MISSED" not in text and "no verdict" in text and "1.250" in text


def _same_process_summary(ratios: list[float]) -> dict:
    """inprocess.py's summary of single-step pairs, one block each: A steps in 1 ms, B in ``ratio`` ms; the
    training thread's CPU 900 us against 914 us a step."""
    from benchmarks.inprocess import summarise_blocks

    wall = {"A": [1e-3] * len(ratios), "B": [1e-3 * r for r in ratios]}
    cpu = {"A": [900e-6] * len(ratios), "B": [914e-6] * len(ratios)}
    return {"processes": 2, "chunk": 1, "rounds": len(ratios), "blocks": summarise_blocks(wall, cpu, 1, 1)}


def test_the_same_process_comparison_judges_the_step_target_by_the_ratio_of_its_totals():
    """The ratio of all of mgpu's step time to all of the hand-written loop's (every log interval counted)
    carries the verdict, with its bootstrap interval; the median per block is shown without one; a MISSED there
    fails the benchmark like a MISSED row of the separate runs."""
    from benchmarks.overhead import missed_targets, report_same_process

    ok_ratios = [1.00, 1.01, 1.02, 1.01, 1.00, 1.02, 1.01, 1.00, 1.01, 1.02, 1.01]
    lines, data = report_same_process("mlp", _same_process_summary(ok_ratios))
    assert data["blocks"]["verdict"] == "ok" and data["blocks"]["target"] == 1.03
    text = "\n".join(lines)
    assert "| step time, mean of all steps (ratio of totals; bootstrap over 11 blocks) | 1000 us | 1010 us | 1.010 |" \
        in text and "<= 1.03 | ok |" in text
    assert "| training-thread CPU per step (B-A, us) | 900 us | 914 us | +14.0 | 14.0-14.0 (95%) |" in text
    assert "1 step(s), 11 pairs; blocks of 1 steps per side" in text
    assert missed_targets({"workloads": {"mlp": {"same_process": data}}}) == []

    high = [r + 0.1 for r in ok_ratios]
    _, data = report_same_process("mlp", _same_process_summary(high))
    assert data["blocks"]["verdict"] == "MISSED"
    assert missed_targets({"workloads": {"mlp": {"same_process": data}}}) == ["mlp"]

    straddling = [0.98, 1.00, 1.02, 1.03, 1.04, 1.05, 1.01, 1.03, 0.99, 1.06, 1.02]
    _, data = report_same_process("charlm", _same_process_summary(straddling))
    assert data["blocks"]["verdict"] == "not resolved" and data["blocks"]["target"] == 1.01


def test_a_failed_same_process_comparison_is_reported_not_judged():
    from benchmarks.overhead import missed_targets, report_same_process

    lines, data = report_same_process("mlp", {"error": "inprocess.py exited 1: boom"})
    assert "failed: inprocess.py exited 1: boom" in "\n".join(lines)
    assert missed_targets({"workloads": {"mlp": {"same_process": data}}}) == []
