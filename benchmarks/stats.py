"""Pure statistics for the benchmarks: step intervals from timestamps, medians, quantiles, ratio summaries.

No torch, no processes: unit-tested in tests/unit/test_bench_stats.py.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from itertools import pairwise


def quantile(values: Sequence[float], q: float) -> float:
    """The ``q`` quantile (0..1) with linear interpolation between order statistics (numpy's default)."""
    if not values:
        return math.nan
    if not 0.0 <= q <= 1.0:
        raise ValueError(f"q must be within [0, 1], got {q}")
    xs = sorted(values)
    pos = q * (len(xs) - 1)
    lo = math.floor(pos)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


def median(values: Sequence[float]) -> float:
    return quantile(values, 0.5)


def step_intervals(steps: Sequence[tuple[int, int, float]], warmup: int) -> list[float]:
    """Durations of single steps from ``(step, epoch, clock)`` records taken when each step finished.

    An interval counts only between two consecutive steps of the same epoch (what lies between epochs,
    validation and checkpoints, is not a training step), and only once ``warmup`` steps have finished.
    """
    out = []
    for (s0, e0, t0), (s1, e1, t1) in pairwise(steps):
        if s0 >= warmup and s1 == s0 + 1 and e1 == e0:
            out.append(t1 - t0)
    return out


def window(steps: Sequence[tuple[int, int, float]], warmup: int) -> tuple[int, float]:
    """(steps, elapsed) summed over the counted intervals: the same intervals as :func:`step_intervals`."""
    n, total = 0, 0.0
    for (s0, e0, t0), (s1, e1, t1) in pairwise(steps):
        if s0 >= warmup and s1 == s0 + 1 and e1 == e0:
            n += 1
            total += t1 - t0
    return n, total


@dataclass(frozen=True)
class Spread:
    """A distribution of per-round values, summarised."""

    n: int
    median: float
    q25: float
    q75: float
    low: float
    high: float

    def fmt(self, digits: int = 3) -> str:
        if self.n == 0:
            return "-"
        f = f"{{:.{digits}f}}"
        return (f"{f.format(self.median)} (IQR {f.format(self.q25)}-{f.format(self.q75)}, "
                f"range {f.format(self.low)}-{f.format(self.high)}, n={self.n})")


def spread(values: Sequence[float]) -> Spread:
    vals = [v for v in values if not math.isnan(v)]
    if not vals:
        return Spread(0, math.nan, math.nan, math.nan, math.nan, math.nan)
    return Spread(len(vals), median(vals), quantile(vals, 0.25), quantile(vals, 0.75), min(vals), max(vals))


def paired_ratios(b: Sequence[float], a: Sequence[float]) -> list[float]:
    """Per-round ratios b[i] / a[i] of two equally long series (a round where either is missing is skipped)."""
    if len(a) != len(b):
        raise ValueError(f"paired series differ in length: {len(b)} vs {len(a)}")
    return [y / x for y, x in zip(b, a, strict=True) if x and x > 0 and not (math.isnan(x) or math.isnan(y))]


def round_orders(rounds: int) -> list[tuple[str, str]]:
    """A/B interleaving: AB, BA, AB, ... so that a slow drift of the machine's load favours neither side."""
    return [("A", "B") if i % 2 == 0 else ("B", "A") for i in range(rounds)]


@dataclass(frozen=True)
class Interval:
    """A confidence interval: for a median, two order statistics of the sample (distribution-free); for a
    ratio of totals, a bootstrap's (:func:`bootstrap_interval`)."""

    low: float
    high: float
    coverage: float  # median_interval: the exact probability that it holds the median; bootstrap: nominal

    def fmt(self, digits: int = 3) -> str:
        if math.isnan(self.low):
            return "-"
        return f"{self.low:.{digits}f}-{self.high:.{digits}f} ({100 * self.coverage:.0f}%)"


def median_interval(values: Sequence[float], confidence: float = 0.95) -> Interval:
    """The narrowest pair of order statistics ``x(k), x(n+1-k)`` that holds the median with at least
    ``confidence`` (the sign-test interval: the count of values below the median is Binomial(n, 1/2)). It
    assumes only that rounds are independent, nothing about the shape of their distribution: fit for ratios
    of run-to-run noise that is skewed and heavy-tailed. Fewer than 6 values never reach 95%: the full range,
    with its real (lower) coverage."""
    xs = sorted(v for v in values if not math.isnan(v))
    n = len(xs)
    if n == 0:
        return Interval(math.nan, math.nan, 0.0)

    # P(x(k) <= median <= x(n+1-k)) = 1 - 2 P(Binomial(n, 1/2) < k), from the running sum of C(n, i), i < k, in
    # exact integers: an int / int division rounds once and cannot overflow (2**n is past a float from n = 1024).
    whole = 2**n

    def coverage(below: int) -> float:
        return 1.0 - (2 * below) / whole

    k, term, below = 1, 1, 1  # term = C(n, k-1); below = sum of C(n, i) for i < k
    while k + 1 <= (n + 1) // 2:
        next_term = term * (n - k + 1) // k  # C(n, k)
        if coverage(below + next_term) < confidence:
            break
        k, term, below = k + 1, next_term, below + next_term
    return Interval(xs[k - 1], xs[n - k], coverage(below))


def block_sums(values: Sequence[float], size: int) -> list[float]:
    """Sums of ``size`` consecutive values (a last, shorter block is left out: every block covers the same steps)."""
    if size < 1:
        raise ValueError(f"block size must be at least 1, got {size}")
    return [math.fsum(values[i:i + size]) for i in range(0, len(values) - size + 1, size)]


def ratio_of_totals(b: Sequence[float], a: Sequence[float]) -> float:
    """``sum(b) / sum(a)``: the ratio of mean step times when both series time the same number of steps."""
    total = math.fsum(a)
    return math.fsum(b) / total if total > 0 else math.nan


def bootstrap_interval(units: Sequence, statistic: Callable[[Sequence], float], confidence: float = 0.95,
                       resamples: int = 2000, seed: int = 0) -> Interval:
    """The percentile bootstrap interval of ``statistic(units)``: ``units`` (paired blocks, each one
    observation) drawn with replacement ``resamples`` times, and the middle ``confidence`` of the statistic's
    values. For a statistic of the whole sample, a ratio of totals, where no order statistic holds it as
    :func:`median_interval`'s do; ``coverage`` is the nominal confidence (it is approximate, and close for
    hundreds of units). Seeded: the same units give the same interval."""
    n = len(units)
    if n == 0:
        return Interval(math.nan, math.nan, 0.0)
    rng = random.Random(seed)
    values = sorted(statistic(rng.choices(units, k=n)) for _ in range(resamples))
    tail = (1.0 - confidence) / 2
    return Interval(quantile(values, tail), quantile(values, 1.0 - tail), confidence)


def totals_ratio_interval(b: Sequence[float], a: Sequence[float], confidence: float = 0.95,
                          resamples: int = 2000, seed: int = 0) -> Interval:
    """:func:`bootstrap_interval` of ``sum(b) / sum(a)`` over the pairs ``(a[i], b[i])`` (blocks of steps)."""
    if len(a) != len(b):
        raise ValueError(f"paired series differ in length: {len(b)} vs {len(a)}")
    pairs = list(zip(a, b, strict=True))
    return bootstrap_interval(pairs, lambda ps: ratio_of_totals([y for _, y in ps], [x for x, _ in ps]), confidence,
                              resamples, seed)


def resolved_verdict(ci: Interval, limit: float) -> str:
    """``ok`` when the whole interval is within the limit, ``MISSED`` when all of it is beyond, otherwise
    ``not resolved``: the rounds measured cannot tell (more rounds, or a quieter machine, can)."""
    if math.isnan(ci.low):
        return "n/a"
    if ci.high <= limit:
        return "ok"
    return "MISSED" if ci.low > limit else "not resolved"
