"""benchmarks/heartbeat_cost.py's parts that need no processes: the pacer's on/off and rate, the 1 Hz scaling."""

from __future__ import annotations

import time

import pytest

from benchmarks.heartbeat_cost import Pacer, scaled_to_1hz


def test_pacer_beats_only_while_enabled_and_measures_its_rate():
    calls = []
    pacer = Pacer(lambda: calls.append(time.perf_counter()), hz=200)
    time.sleep(0.05)
    assert calls == []  # created paused
    pacer.set(True)
    time.sleep(0.3)
    pacer.set(False)
    time.sleep(0.02)  # a beat already past its wait may still land
    stopped_at = len(calls)
    time.sleep(0.1)
    assert len(calls) == stopped_at  # paused again
    assert 10 <= pacer.beats <= 70  # ~60 at 200 Hz less the scheduler's delays; a loaded machine beats fewer
    assert pacer.enabled_s == pytest.approx(0.3, abs=0.1)
    assert pacer.rate == pytest.approx(pacer.beats / pacer.enabled_s)


def test_ratios_scale_linearly_to_one_beat_a_second():
    assert scaled_to_1hz(1.10, 50.0) == pytest.approx(1.002)
    assert scaled_to_1hz(0.95, 10.0) == pytest.approx(0.995)
    assert scaled_to_1hz(1.0, 200.0) == 1.0
    assert scaled_to_1hz(1.2, 0.0) != scaled_to_1hz(1.2, 0.0)  # no beats: NaN, not a number to publish
