"""benchmarks/inprocess.py's summary: chunks paired across sides, ranks combined (no processes, no timing)."""

from __future__ import annotations

import argparse

import pytest

from benchmarks.inprocess import summarise


def test_chunks_pair_by_index_and_ranks_combine():
    args = argparse.Namespace(workload="mlp", rounds=3, chunk=2)
    # per chunk: (training-thread CPU seconds for the chunk, the wall time of each of its 2 steps)
    rank0 = {"A": [(0.002, [0.001, 0.003]), (0.002, [0.002, 0.002]), (0.004, [0.002, 0.002])],
             "B": [(0.003, [0.001, 0.003]), (0.002, [0.004, 0.004]), (0.004, [0.002, 0.003])]}
    rank1 = {"A": [(0.002, [0.001, 0.001]), (0.002, [0.002, 0.002]), (0.002, [0.002, 0.002])],
             "B": [(0.003, [0.001, 0.001]), (0.004, [0.002, 0.002]), (0.002, [0.002, 0.002])]}
    out = summarise(args, [rank0, rank1], log_every=20, threads=1)
    assert out["processes"] == 2 and out["chunk"] == 2
    # CPU per step: mean of the ranks over the chunk's 2 steps; B - A per chunk: +500, +500, 0 us
    assert out["cpu_per_step"]["diff_us"]["median"] == pytest.approx(500.0)
    assert out["cpu_per_step"]["A_us"] == pytest.approx(1000.0)
    # wall per step: the slower rank's chunk; mean ratios per chunk: 1, 2, 1.25 -> median 1.25
    assert out["wall_per_step_mean"]["ratio"]["median"] == pytest.approx(1.25)
    # median step of the slower rank's chunk: A 2, 2, 2 ms; B 2, 4, 2.5 ms
    assert out["wall_per_step_median"]["ratio"]["median"] == pytest.approx(1.25)
    assert out["wall_per_step_median"]["ratio_ci95"]["coverage"] == pytest.approx(0.75)  # 3 pairs: the range


def test_blocks_of_single_step_pairs_give_the_ratio_of_totals():
    """--chunk 1: pairs of single steps, summed over blocks of log_every pairs (here 2): the slower rank's step
    each time, every step counted (the 3 ms step of B's second block as much as any other)."""
    args = argparse.Namespace(workload="mlp", rounds=4, chunk=1)
    rank0 = {"A": [(0.001, [0.001]), (0.001, [0.001]), (0.001, [0.002]), (0.001, [0.001])],
             "B": [(0.002, [0.001]), (0.001, [0.001]), (0.001, [0.003]), (0.002, [0.001])]}
    rank1 = {"A": [(0.001, [0.002]), (0.001, [0.001]), (0.001, [0.001]), (0.001, [0.001])],
             "B": [(0.002, [0.002]), (0.001, [0.001]), (0.001, [0.001]), (0.002, [0.001])]}
    blocks = summarise(args, [rank0, rank1], log_every=2, threads=1)["blocks"]
    assert blocks["n"] == 2 and blocks["steps_per_side"] == 2
    # A: 2+1, 2+1 ms; B: 2+1, 3+1 ms -> 6 ms / 7 ms over 4 steps each
    assert blocks["A_us"] == pytest.approx(1500.0) and blocks["B_us"] == pytest.approx(1750.0)
    assert blocks["ratio"] == pytest.approx(7 / 6)
    assert blocks["block_ratio"]["median"] == pytest.approx((1.0 + 4 / 3) / 2)
    ci = blocks["ratio_ci95"]
    assert ci["low"] == pytest.approx(1.0) and ci["high"] == pytest.approx(4 / 3) and ci["coverage"] == 0.95
    # CPU: mean of the ranks per step; B - A = (1 + 0 + 0 + 1) ms / 4 steps
    assert blocks["cpu_A_us"] == pytest.approx(1000.0) and blocks["cpu_diff_us"] == pytest.approx(500.0)


def test_a_distributed_run_that_fails_comes_back_as_an_error_with_its_exit_code(tmp_path):
    from benchmarks.inprocess import distributed_json

    script = tmp_path / "fails.py"
    script.write_text("import sys\nprint('{\"not\": \"reached\"}' if False else 'boom')\nsys.exit(3)\n")
    out = distributed_json(str(script), [], nproc=1, timeout=120)
    assert out["rc"] == 1 and "fails.py exited 1" in out["error"] and "boom" in out["error"]  # torchrun: 1
    script.write_text("import json\nprint('noise')\nprint(json.dumps({'ok': 1}))\n")
    assert distributed_json(str(script), [], nproc=1, timeout=120) == {"ok": 1}


def test_the_time_between_mgpu_steps_is_not_its_interval_time(monkeypatch):
    """The other side's chunk runs between two of mgpu's steps: its log interval's clock skips that time, so
    that its records and the pace of its shared all-reduces count mgpu's own steps only."""
    from types import SimpleNamespace

    from benchmarks import inprocess

    now = [100.0]
    monkeypatch.setattr(inprocess.time, "perf_counter", lambda: now[0])
    monkeypatch.setattr(inprocess, "_endless", lambda loader, sampler: iter(range(10)))

    def optimizer_step():
        now[0] += 0.5  # each of mgpu's steps takes 0.5 s

    trainer = SimpleNamespace(wrapped=SimpleNamespace(train=SimpleNamespace(train=lambda: None)),
                              loaders=SimpleNamespace(train=None, sampler=None), hot=SimpleNamespace(grad_accum=1),
                              _forward_backward=lambda batch, sync: None, _optimizer_step=optimizer_step)
    step = inprocess.mgpu_trainer(trainer)
    step()
    step()
    now[0] += 7.0  # the other side's chunk
    step()
    assert trainer._interval_start == 107.0 and now[0] - trainer._interval_start == 1.5  # three steps of 0.5 s


def test_a_short_two_process_run_takes_turns_step_by_step(tmp_path):
    """The real script on 2 gloo processes, single steps with no barrier between them: 40 pairs make 2 blocks
    of one log interval (20 steps per side), and nothing is left running."""
    import json
    import sys

    from tests.procs import REPO, group_alive, run

    r = run([sys.executable, "benchmarks/inprocess.py", "--nproc", "2", "--rounds", "40", "--timeout", "150"],
            cwd=REPO, timeout=180)
    assert r.returncode == 0, r.output
    result = json.loads(r.stdout.strip().splitlines()[-1])
    assert result["processes"] == 2 and result["chunk"] == 1 and result["rounds"] == 40
    blocks = result["blocks"]
    assert blocks["n"] == 2 and blocks["steps_per_side"] == 20 and blocks["A_us"] > 0 and blocks["ratio"] > 0
    assert group_alive(r.pid) == []


def test_the_worker_fixes_the_malloc_thresholds_for_both_sides_before_measuring(monkeypatch):
    """Both sides share one heap: its thresholds are fixed (as mgpu train fixes them) before anything is
    measured, not left to the process's history."""
    from benchmarks import inprocess
    from mgpucli import heap

    calls = []
    monkeypatch.setattr(heap, "steady_heap", lambda: calls.append("heap") or True)
    assert inprocess.run_worker(lambda args: calls.append("measure"), argparse.Namespace()) == 0
    assert calls == ["heap", "measure"]
