"""The step path's rules, counted: no host sync per step, one collective of mgpu's per log interval.

A real Trainer takes 100 steps of the quickstart in this process, inside a gloo process group of one (a real
group, so mgpu's collectives run for real). Every way a tensor's value reaches the host (``.item()``,
``.tolist()``, ``.cpu()``, ``.numpy()``, ``float()``/``int()``/``bool()`` of a tensor) and every collective
mgpu can call are counted. With ``log_every=10`` the 100 steps close 10 intervals and read 9 of them (the last is
read by the step after): 9 host syncs and 10 all-reduces. One ``.item()`` added to the step path makes it 109.
The step anatomy (host clocks, ``trainer.anatomy=true`` here) rides the same all-reduce: every record has it,
nothing is added.
"""

from __future__ import annotations

import functools
from collections import Counter

import pytest
import torch
import torch.distributed as dist

from mgpucli.config import load_recipe
from mgpucli.distributed.env import RankEnv
from mgpucli.distributed.runtime import Runtime
from mgpucli.engine.reporter import NullReporter
from mgpucli.engine.trainer import Trainer
from tests.procs import RECIPES

STEPS, LOG_EVERY = 100, 10
SYNCS = ("item", "tolist", "cpu", "numpy", "__float__", "__int__", "__bool__")
COLLECTIVES = ("all_reduce", "broadcast", "all_gather", "all_gather_object", "broadcast_object_list", "barrier",
               "reduce_scatter", "gather_object")


@pytest.fixture
def group_of_one():
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        yield Runtime(env=RankEnv(), device=torch.device("cpu"), backend="gloo", cpu_threads=1)
    finally:
        dist.destroy_process_group()


def _counting(monkeypatch, counts: Counter) -> None:
    for name in SYNCS:
        original = getattr(torch.Tensor, name)

        @functools.wraps(original)
        def counted(*args, _original=original, _name=name, **kwargs):
            counts[f"sync {_name}"] += 1
            return _original(*args, **kwargs)

        monkeypatch.setattr(torch.Tensor, name, counted)
    for name in COLLECTIVES:
        original = getattr(dist, name)

        @functools.wraps(original)
        def collective(*args, _original=original, _name=name, **kwargs):
            counts[f"collective {_name}"] += 1
            return _original(*args, **kwargs)

        monkeypatch.setattr(dist, name, collective)


@pytest.mark.parametrize("features", [
    [],
    ["trainer.ema.decay=0.99"],  # the average: one fused device op per step, no sync, no collective
], ids=["plain", "ema"])
def test_100_steps_sync_and_reduce_once_per_log_interval(tmp_path, monkeypatch, group_of_one, features):
    cfg = load_recipe(str(RECIPES / "quickstart.yaml"),
                      [f"run_dir={tmp_path / 'run'}", "trainer.device=cpu", f"trainer.log_every={LOG_EVERY}",
                       "data.train.num_samples=8192", "data.val=null", "trainer.tensorboard=false",
                       "trainer.anatomy=true", *features])
    trainer = Trainer(cfg, group_of_one, NullReporter())
    trainer.setup()
    ema = trainer.trained.ema
    start = [t.clone() for t in ema.shadow] if ema is not None else []
    records = []
    trainer.intervals.emit = records.append
    try:
        batches = iter(trainer.loaders.train)
        trainer.trained.model.train.train()
        for _ in range(LOG_EVERY):  # warm up up to an interval's end: the sampler's first draw is behind us
            assert trainer.train_step(batches)
        trainer.intervals.read_reduction()
        counts: Counter = Counter()
        _counting(monkeypatch, counts)
        for _ in range(STEPS):
            assert trainer.train_step(batches)
        monkeypatch.undo()
    finally:
        trainer.close()
    assert trainer.step == LOG_EVERY + STEPS
    if ema is not None:  # the average did move, every step
        assert all(not torch.equal(a, b) for a, b in zip(start, ema.shadow, strict=True))
    reads = STEPS // LOG_EVERY - 1
    syncs = sum(n for k, n in counts.items() if k.startswith("sync"))
    collectives = sum(n for k, n in counts.items() if k.startswith("collective"))
    assert syncs == reads, counts
    assert collectives == counts["collective all_reduce"] == STEPS // LOG_EVERY, counts
    assert [r["step"] for r in records][-reads:] == list(range(2 * LOG_EVERY, STEPS + 1, LOG_EVERY))
    for record in records[-reads:]:
        (mine,) = record["anatomy"]
        assert mine["step_s"] > 0 and mine["compute"] > 0
        assert sum(mine[p] for p in ("data", "compute", "comm", "optimizer", "other")) == pytest.approx(1.0)


def test_a_step_without_the_anatomy_reads_no_clock_and_sums_small_batches_at_the_interval(tmp_path, monkeypatch,
                                                                                           group_of_one):
    """Features that are off cost nothing per step: with ``trainer.anatomy`` off (the default) mgpu reads no clock
    on the step path, and the quickstart's small batches run no ``Task.stats`` until the interval ends."""
    import sys
    import time

    cfg = load_recipe(str(RECIPES / "quickstart.yaml"),
                      [f"run_dir={tmp_path / 'run'}", "trainer.device=cpu", "trainer.log_every=1000",
                       "data.val=null", "trainer.tensorboard=false"])
    trainer = Trainer(cfg, group_of_one, NullReporter())
    trainer.setup()
    counts: Counter = Counter()
    clock = time.perf_counter

    def perf_counter():
        if sys._getframe(1).f_globals.get("__name__", "").startswith("mgpucli"):
            counts["clock"] += 1
        return clock()

    task_stats = trainer.task.stats

    def stats(*args, **kwargs):
        counts["stats"] += 1
        return task_stats(*args, **kwargs)

    try:
        assert trainer.clock is None
        batches = iter(trainer.loaders.train)
        trainer.trained.model.train.train()
        monkeypatch.setattr(time, "perf_counter", perf_counter)
        monkeypatch.setattr(trainer.task, "stats", stats)
        for _ in range(20):
            assert trainer.train_step(batches)
        assert counts == Counter()
        trainer.intervals.flush(trainer.step, 1, 0.1, stop_requested=False)
        assert counts["stats"] == 1  # the interval's 20 steps, added in one call
    finally:
        monkeypatch.undo()
        trainer.close()
