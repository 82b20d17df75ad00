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
