"""benchmarks/sections.py: each call's time goes to the side whose chunk runs; the table's rest is the step minus
its timed sections (no processes, no timing claims)."""

from __future__ import annotations

from benchmarks.sections import Clock, table


def test_a_wrapped_call_is_charged_to_the_running_side_even_when_it_raises():
    clock = Clock()
    calls = []
    f = clock.wrap("loss", lambda x: calls.append(x) or x * 2)
    clock.side = "B"
    assert f(3) == 6 and calls == [3]
    assert clock.ns[("B", "loss")] > 0 and clock.ns[("A", "loss")] == 0

    def boom():
        raise ValueError("x")

    g = clock.wrap("backward", boom)
    clock.side = "A"
    try:
        g()
    except ValueError:
        pass
    assert clock.ns[("A", "backward")] > 0


def test_the_table_gives_per_step_figures_and_the_rest():
    clock = Clock()
    ns = clock.ns
    # 10 steps a side; A: step 500 us of which forward 100; B: step 560 us, forward 100, step_stats 20
    ns[("A", "step")], ns[("A", "forward")] = 5_000_000, 1_000_000
    ns[("B", "step")], ns[("B", "forward")], ns[("B", "step_stats")] = 5_600_000, 1_000_000, 200_000
    lines = table(clock, {"A": 10, "B": 10})
    assert "| forward | 100.00 | 100.00 | +0.00 |" in lines
    assert "| step_stats | 0.00 | 20.00 | +20.00 |" in lines
    assert "| rest (the loop, bookkeeping) | 400.00 | 440.00 | +40.00 |" in lines
    assert lines[-1] == "| **whole step** | 500.00 | 560.00 | +60.00 |"
