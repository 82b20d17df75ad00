"""The benchmark's pure statistics (benchmarks/stats.py): no processes, no timing."""

from __future__ import annotations

import math

import pytest

from benchmarks.stats import median, quantile, round_orders


def test_quantile_interpolates_like_numpy():
    xs = [4.0, 1.0, 3.0, 2.0]
    assert median(xs) == 2.5
    assert quantile(xs, 0.25) == pytest.approx(1.75)
    assert quantile(xs, 0.0) == 1.0 and quantile(xs, 1.0) == 4.0
    assert math.isnan(median([]))
    with pytest.raises(ValueError):
        quantile(xs, 1.5)


def test_rounds_alternate_order():
    assert round_orders(3) == [("A", "B"), ("B", "A"), ("A", "B")]


def test_median_interval_is_the_sign_test_interval():
    from benchmarks.stats import median_interval

    # n=12: x(3)..x(10), coverage 1 - 2 P(Bin(12, 1/2) <= 2) = 0.961; n=20: x(6)..x(15); n=40: x(14)..x(27)
    for n, (k_low, k_high) in {12: (3, 10), 20: (6, 15), 40: (14, 27)}.items():
        ci = median_interval([float(v) for v in range(n, 0, -1)])  # order does not matter
        assert (ci.low, ci.high) == (k_low, k_high) and 0.95 <= ci.coverage < 0.97
    small = median_interval([3.0, 1.0, 2.0, 5.0, 4.0])  # too few for 95%: the range, with its real coverage
    assert (small.low, small.high) == (1.0, 5.0) and small.coverage == 1 - 2 / 32
    assert math.isnan(median_interval([math.nan]).low) and median_interval([]).coverage == 0.0


def test_a_target_is_met_or_missed_only_when_the_interval_says_so():
    from benchmarks.stats import Interval, resolved_verdict

    assert resolved_verdict(Interval(0.98, 1.02, 0.96), 1.03) == "ok"
    assert resolved_verdict(Interval(1.04, 1.10, 0.96), 1.03) == "MISSED"
    assert resolved_verdict(Interval(0.99, 1.05, 0.96), 1.03) == "not resolved"
    assert resolved_verdict(Interval(math.nan, math.nan, 0.0), 1.03) == "n/a"


def test_median_interval_of_thousands_of_values():
    """2**n is past a float from n = 1024, and the interval must still be the sign-test one (normal
    approximation: k ~ n/2 - 1.96 sqrt(n)/2)."""
    from benchmarks.stats import median_interval

    for n in (1000, 1024, 1025, 3000, 10000):
        ci = median_interval([float(v) for v in range(1, n + 1)])
        k = int(ci.low)  # values 1..n: x(k) = k
        assert ci.high == n + 1 - k and 0.95 <= ci.coverage < 0.96
        assert abs(k - (n / 2 - 1.96 * math.sqrt(n) / 2)) <= 2
