"""benchmarks/pieces.py: the heartbeat pacer and the 1 Hz scaling (no processes), and a short real run of
each piece that needs one process."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from benchmarks.pieces import Pacer, scaled_to_1hz


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


def test_each_piece_switches_on_and_off():
    from types import SimpleNamespace

    from benchmarks import pieces
    from mgpucli.engine.trainer import StepSettings

    def trainer():
        hot = StepSettings(grad_accum=1, channels_last=False, clip_grad_norm=None, scheduler_interval="step",
                           log_every=20, checkpoint_every_steps=None, max_steps=None)
        tb = SimpleNamespace(max_queue=10, flush=lambda: None)
        return SimpleNamespace(hot=hot, writer=SimpleNamespace(_tb=tb), progress=None), tb

    t, tb = trainer()
    set_piece, pacer = pieces.switch(t, "interval", 200)
    set_piece(False)
    assert t.hot.log_every == 10**9 and pacer is None
    set_piece(True)
    assert t.hot.log_every == 20
    t, tb = trainer()
    writer = t.writer
    set_piece, _ = pieces.switch(t, "writer", 200)
    set_piece(False)
    assert t.writer is None
    set_piece(True)
    assert t.writer is writer
    set_piece, _ = pieces.switch(t, "tensorboard", 200)
    set_piece(False)
    assert t.writer._tb is None
    set_piece(True)
    assert t.writer._tb is tb
    set_piece, _ = pieces.switch(t, "tensorboard-unbatched", 200)
    set_piece(True)
    assert tb.max_queue == 1  # "with": each event written at once
    set_piece(False)
    assert tb.max_queue == 10
    from mgpucli.engine import interval

    set_piece, _ = pieces.switch(t, "shared", 200)
    set_piece(False)
    assert interval.REDUCE_EVERY_S == 0.0 and interval.intervals_per_reduction(1e-6) == 1  # one per interval
    set_piece(True)
    assert interval.REDUCE_EVERY_S == 0.25 and interval.intervals_per_reduction(1e-6) == interval.MAX_BATCH


def test_a_short_real_run_reports_paired_chunks():
    import json
    import subprocess
    import sys

    cmd = [sys.executable, "benchmarks/pieces.py", "--piece", "interval", "--rounds", "2", "--chunk", "20"]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=120, cwd=Path(__file__).resolve().parents[2])
    assert out.returncode == 0, out.stderr
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert result["piece"] == "interval" and result["processes"] == 1 and result["rounds"] == 2
    assert result["wall_per_step_median"]["ratio"]["n"] == 2 and result["cpu_per_step"]["diff_us"]["n"] == 2


def test_the_heartbeat_needs_two_processes(monkeypatch):
    from benchmarks import pieces

    monkeypatch.delenv("LOCAL_RANK", raising=False)
    with pytest.raises(SystemExit):
        pieces.parse_args(["--piece", "heartbeat"])
