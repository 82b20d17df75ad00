"""The benchmark's pure statistics (benchmarks/stats.py): no processes, no timing."""

from __future__ import annotations

import math

import pytest

from benchmarks.stats import median, paired_ratios, quantile, round_orders, spread, step_intervals, verdict, window


def test_quantile_interpolates_like_numpy():
    xs = [4.0, 1.0, 3.0, 2.0]
    assert median(xs) == 2.5
    assert quantile(xs, 0.25) == pytest.approx(1.75)
    assert quantile(xs, 0.0) == 1.0 and quantile(xs, 1.0) == 4.0
    assert math.isnan(median([]))
    with pytest.raises(ValueError):
        quantile(xs, 1.5)


def test_step_intervals_skip_warmup_and_epoch_boundaries():
    # (step, epoch, clock): steps 1-3 in epoch 0, 4-5 in epoch 1 (validation between 3 and 4 took 10 s)
    steps = [(1, 0, 0.0), (2, 0, 1.0), (3, 0, 3.0), (4, 1, 13.0), (5, 1, 13.5)]
    assert step_intervals(steps, warmup=0) == [1.0, 2.0, 0.5]
    assert step_intervals(steps, warmup=2) == [2.0, 0.5]
    assert window(steps, warmup=0) == (3, 3.5)


def test_step_intervals_need_consecutive_steps():
    assert step_intervals([(1, 0, 0.0), (3, 0, 1.0)], warmup=0) == []


def test_paired_ratios_and_spread():
    assert paired_ratios([2.0, 3.0, float("nan")], [1.0, 2.0, 1.0]) == [2.0, 1.5]
    with pytest.raises(ValueError):
        paired_ratios([1.0], [1.0, 2.0])
    s = spread([1.0, 2.0, 3.0, 4.0, 5.0])
    assert (s.n, s.median, s.q25, s.q75, s.low, s.high) == (5, 3.0, 2.0, 4.0, 1.0, 5.0)
    assert "IQR 2.000-4.000" in s.fmt(3)
    assert spread([]).fmt() == "-"


def test_rounds_alternate_order_and_verdicts():
    assert round_orders(3) == [("A", "B"), ("B", "A"), ("A", "B")]
    assert verdict(1.02, 1.03) == "ok" and verdict(1.04, 1.03) == "MISSED" and verdict(math.nan, 1.0) == "n/a"
