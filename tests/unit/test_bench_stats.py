"""The benchmark's pure statistics (benchmarks/stats.py): no processes, no timing."""

from __future__ import annotations

import math

import pytest

from benchmarks.stats import median, paired_ratios, quantile, round_orders, spread, step_intervals, window


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
    assert math.isnan(median_interval([math.nan]).low) and median_interval([]).fmt() == "-"
    assert "(96%)" in median_interval([float(v) for v in range(12)]).fmt(2)


def test_a_target_is_met_or_missed_only_when_the_interval_says_so():
    from benchmarks.stats import Interval, resolved_verdict

    assert resolved_verdict(Interval(0.98, 1.02, 0.96), 1.03) == "ok"
    assert resolved_verdict(Interval(1.04, 1.10, 0.96), 1.03) == "MISSED"
    assert resolved_verdict(Interval(0.99, 1.05, 0.96), 1.03) == "not resolved"
    assert resolved_verdict(Interval(math.nan, math.nan, 0.0), 1.03) == "n/a"


def test_median_interval_of_thousands_of_values():
    """inprocess.py --rounds 3000 gives 3000 chunk ratios: 2**n is past a float from n = 1024, and the interval
    must still be the sign-test one (normal approximation: k ~ n/2 - 1.96 sqrt(n)/2)."""
    from benchmarks.stats import median_interval

    for n in (1000, 1024, 1025, 3000, 10000):
        ci = median_interval([float(v) for v in range(1, n + 1)])
        k = int(ci.low)  # values 1..n: x(k) = k
        assert ci.high == n + 1 - k and 0.95 <= ci.coverage < 0.96
        assert abs(k - (n / 2 - 1.96 * math.sqrt(n) / 2)) <= 2


def test_block_sums_cover_whole_blocks_only():
    from benchmarks.stats import block_sums

    assert block_sums([1.0, 2.0, 3.0, 4.0, 5.0], 2) == [3.0, 7.0]  # the last, shorter block is left out
    assert block_sums([1.0, 2.0], 1) == [1.0, 2.0] and block_sums([1.0], 2) == []
    with pytest.raises(ValueError):
        block_sums([1.0], 0)


def test_the_ratio_of_totals_weighs_every_step_where_a_median_of_ratios_does_not():
    """One block in eight carries a shared all-reduce that costs 0.8 ms more: the median of block ratios does
    not see it, the ratio of totals (the ratio of mean step times) does."""
    from benchmarks.stats import ratio_of_totals

    a = [20.0] * 8
    b = [20.0] * 7 + [20.8]
    assert median(paired_ratios(b, a)) == 1.0
    assert ratio_of_totals(b, a) == pytest.approx(160.8 / 160.0)
    assert math.isnan(ratio_of_totals([1.0], [0.0]))


def test_the_bootstrap_interval_holds_the_ratio_95_times_in_100_and_narrows_with_more_blocks():
    import random

    from benchmarks.stats import totals_ratio_interval

    rng = random.Random(1)

    def blocks(n):  # noisy blocks (the machine's drift, shared by the pair) with a true ratio of 1.02
        a = [rng.uniform(20.0, 80.0) for _ in range(n)]
        return [x * 1.02 * rng.gauss(1.0, 0.05) for x in a], a

    samples = [totals_ratio_interval(*blocks(40), resamples=400, seed=i) for i in range(300)]
    held = sum(ci.low <= 1.02 <= ci.high for ci in samples) / len(samples)
    assert 0.88 <= held <= 0.99, held  # nominal 95% (the percentile bootstrap runs a little short on 40 blocks)
    few, many = totals_ratio_interval(*blocks(100)), totals_ratio_interval(*blocks(3000))
    assert many.high - many.low < (few.high - few.low) / 3  # ~sqrt(30) narrower
    assert many.coverage == 0.95
    b, a = blocks(50)
    assert totals_ratio_interval(b, a) == totals_ratio_interval(b, a)  # seeded: the same blocks, the same interval
    assert math.isnan(totals_ratio_interval([], []).low)
    with pytest.raises(ValueError):
        totals_ratio_interval([1.0], [])
