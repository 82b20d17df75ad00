"""The step anatomy's records and the straggler read from them (run_records/step_anatomy.py): pure logic."""

from __future__ import annotations

import random

import pytest

from mgpucli.engine.anatomy import StepClock, StragglerWatch
from mgpucli.run_records import step_anatomy as sa


def entry(step_s: float, **shares: float) -> dict[str, float]:
    out = {"step_s": step_s, "data": 0.0, "compute": 0.0, "comm": 0.0, "optimizer": 0.0, **shares}
    out["other"] = max(0.0, 1.0 - sum(out[p] for p in sa.PHASES[:4]))
    return out


def record(*ranks: dict[str, float], step: int = 0) -> dict:
    return {"split": "train", "step": step, sa.KEY: list(ranks)}


SLOW_DATA = [entry(0.17, data=0.95, compute=0.02, comm=0.02), entry(0.17, data=0.01, compute=0.02, comm=0.95)]
SLOW_COMPUTE = [entry(0.1, data=0.05, compute=0.9, comm=0.01), entry(0.1, data=0.05, compute=0.3, comm=0.6)]


def test_a_rank_slow_to_load_is_named_with_its_cause_and_the_recipes_fix():
    records = [record(*SLOW_DATA[::-1])] + [record(*SLOW_DATA[::-1], step=s) for s in range(4)]
    found = sa.find_straggler(records)
    assert (found.rank, found.cause, found.intervals, found.of) == (1, "data", 4, 4)  # the first is warm-up
    line = sa.summary(found, num_workers=0)
    assert line.startswith("rank 1 waits for data 95% of its steps; the others wait for rank 1 in all-reduce")
    assert line.endswith("raise data.num_workers (now 0).")
    assert "check that rank's dataset reads" in sa.summary(found, num_workers=4)
    assert "DataLoader's num_workers" in sa.summary(found, script=True)


def test_compute_and_host_causes():
    found = sa.find_straggler([record(*SLOW_COMPUTE)] * 4)
    assert (found.rank, found.cause) == (0, "compute") and "mgpu doctor" in sa.summary(found)
    host = [entry(0.1, data=0.05, compute=0.1, comm=0.01, optimizer=0.1), entry(0.1, data=0.05, compute=0.1, comm=0.6)]
    found = sa.find_straggler([record(*host)] * 4)
    assert (found.rank, found.cause) == (0, "host") and "trainer.cpu_threads" in sa.summary(found)


def test_no_straggler_when_the_ranks_take_turns_or_nobody_waits():
    assert sa.find_straggler([record(*SLOW_DATA), record(*SLOW_DATA[::-1])] * 3) is None  # not persistent
    assert sa.find_straggler([record(*SLOW_DATA)] * 2) is None  # too few intervals to say
    balanced = [entry(0.01, data=0.1, compute=0.3, comm=0.5), entry(0.01, data=0.1, compute=0.3, comm=0.5)]
    assert sa.find_straggler([record(*balanced)] * 10) is None
    # a lead the others did not wait for (their comm share is small) is not a straggler
    unwaited = [entry(0.1, data=0.9, comm=0.0), entry(0.1, data=0.05, comm=0.05)]
    assert sa.find_straggler([record(*unwaited)] * 5) is None
    assert sa.find_straggler([{"split": "train", "step": 1}, {"split": "val"}, record(SLOW_DATA[0])]) is None


def test_ranks_taking_turns_on_a_loaded_machine_name_nobody():
    """Two ranks in lockstep (one step time) on shared cores: each waits 20-70% of an interval, at random."""
    rng = random.Random(0)

    def noisy(step_s: float) -> dict[str, float]:
        comm = rng.uniform(0.2, 0.7)
        return entry(step_s, data=rng.uniform(0.02, 0.1), compute=(1 - comm) * 0.6, comm=comm)

    named = 0
    for _ in range(1000):
        steps = [rng.uniform(0.002, 0.004) for _ in range(4)]
        named += sa.find_straggler([record(noisy(s), noisy(s)) for s in steps]) is not None
    assert named <= 1, named  # a false alarm in 1000 short runs of this pessimistic model, at most


def test_figures_are_shares_of_the_wall_time_and_flatten_for_trackers():
    got = sa.figures([1.0, 2.0, 0.5, 0.5], wall_s=5.0, steps=10)
    assert got == pytest.approx({"step_s": 0.5, "data": 0.2, "compute": 0.4, "comm": 0.1, "optimizer": 0.1,
                                 "other": 0.2})
    flat = sa.scalars(record(got, got))
    assert flat["anatomy/rank1/data"] == 0.2 and len(flat) == 12


def test_the_clock_counts_backwards_tail_after_the_last_gradient_as_comm():
    clock = StepClock()
    clock.add_data(0.5)
    clock.handed_over = 10.75
    clock.add_backward(10.0, 11.0)  # 0.75 s computing, then 0.25 s waiting for the all-reduce
    clock.add_backward(20.0, 20.5)  # no gradient noted (one process): all compute
    clock.handed_over = 30.25
    clock.add_backward(30.0, 30.5, communicated=False)  # a no_sync micro-step: no all-reduce to wait for
    clock.add_optimizer(40.0, 40.125)
    assert clock.take() == [0.5, 1.75, 0.25, 0.125] and clock.take() == [0.0, 0.0, 0.0, 0.0]


def test_the_watch_speaks_once_per_verdict():
    watch = StragglerWatch(num_workers=0, pin_memory="auto", device="cpu")
    said = [watch.observe(record(*SLOW_DATA[::-1], step=s)) for s in range(8)]
    assert [s for s in said if s] == [said[3]] and said[3].startswith("rank 1 waits for data")
