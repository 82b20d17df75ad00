"""Pure statistics for the benchmarks: quantiles, the median's distribution-free 95% interval, verdicts.

No torch, no processes: unit-tested in tests/unit/test_bench_stats.py.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass


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


def round_orders(rounds: int) -> list[tuple[str, str]]:
    """A/B interleaving: AB, BA, AB, ... so that a slow drift of the machine's load favours neither side."""
    return [("A", "B") if i % 2 == 0 else ("B", "A") for i in range(rounds)]


@dataclass(frozen=True)
class Interval:
    """A confidence interval of a median: two order statistics of the sample (distribution-free)."""

    low: float
    high: float
    coverage: float  # the exact probability that it holds the median


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


def resolved_verdict(ci: Interval, limit: float) -> str:
    """``ok`` when the whole interval is within the limit, ``MISSED`` when all of it is beyond, otherwise
    ``not resolved``: the rounds measured cannot tell (more rounds, or a quieter machine, can)."""
    if math.isnan(ci.low):
        return "n/a"
    if ci.high <= limit:
        return "ok"
    return "MISSED" if ci.low > limit else "not resolved"
