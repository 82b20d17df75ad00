"""When a stop signal is a second one (mgpucli/stop_signals.py): a moment after the first, not the first delivered
twice at once."""

from __future__ import annotations

from mgpucli.stop_signals import AGAIN, AGAIN_AFTER_S, FIRST, SAME, SignalCount


def test_a_signal_within_the_moment_after_the_first_is_the_same_one_and_after_it_is_again():
    now = [10.0]
    count = SignalCount(lambda: now[0])
    said = [count.arrived()]
    for step in (0.001, AGAIN_AFTER_S * 0.9 - 0.001, AGAIN_AFTER_S * 0.2, 1.0):
        now[0] += step
        said.append(count.arrived())
    assert said == [FIRST, SAME, SAME, AGAIN, AGAIN]


def test_the_moment_is_counted_from_the_signal_that_counted_not_the_latest():
    """Ctrl-C mashed every 0.3 s: every press that lands past the moment after the last one that counted is 'again';
    a second Ctrl-C delivered twice (GNU timeout) is one second Ctrl-C."""
    now = [0.0]
    count = SignalCount(lambda: now[0])
    said = []
    for _ in range(5):
        said.append(count.arrived())
        now[0] += 0.3
    assert said == [FIRST, SAME, AGAIN, SAME, AGAIN]
