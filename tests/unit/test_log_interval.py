"""The log interval on one process: records are the tasks' sums, read a step after the interval closes, with their
own step, epoch and rate; a non-finite loss stops the run naming its step; a stop request is agreed."""

from __future__ import annotations

import contextlib

import pytest
import torch

from mgpucli.distributed.env import RankEnv
from mgpucli.distributed.runtime import Runtime
from mgpucli.engine.log_interval import LogInterval
from mgpucli.engine.tasks import Classification, Regression
from mgpucli.errors import JobFailed


class _Heartbeat:
    step, phase = 0, "setup"

    def in_phase(self, phase):
        return contextlib.nullcontext()


def _interval(task):
    records = []
    runtime = Runtime(env=RankEnv(), device=torch.device("cpu"), backend=None)
    return LogInterval(task, runtime, _Heartbeat(), records.append), records


def _batches(task, count, seed=0):
    gen = torch.Generator().manual_seed(seed)
    for _ in range(count):
        outputs = torch.randn(8, 4, generator=gen)
        targets = (torch.randint(4, (8,), generator=gen) if isinstance(task, Classification)
                   else torch.randn(8, 4, generator=gen))
        yield outputs, targets, task.loss(outputs, targets).detach()


@pytest.mark.parametrize("task", [Classification(), Regression()], ids=["classification", "regression"])
def test_a_record_holds_the_tasks_sums_of_its_steps(task):
    intervals, records = _interval(task)
    expected = torch.zeros(len(task.stat_names), dtype=torch.float64)
    for step, (outputs, targets, loss) in enumerate(_batches(task, 5), start=1):
        row = task.stats(outputs, targets, loss)
        expected += row
        intervals.add(row, loss, step)
        intervals.steps += 1
    intervals.close_and_reduce(5, epoch=1, lr=0.1, stop_requested=False)
    assert records == []  # the all-reduce runs while the next step computes
    intervals.read_reduction()
    (record,) = records
    assert {k: record[k] for k in ("split", "step", "epoch", "lr")} == {"split": "train", "step": 5, "epoch": 1,
                                                                       "lr": 0.1}
    assert {k: record[k] for k in task.metrics(expected.tolist())} == task.metrics(expected.tolist())
    assert record["samples_per_s"] > 0
    assert intervals.epoch_sums == expected.tolist()  # the epoch's means come from the same sums
    assert intervals.epoch_means() == task.metrics(expected.tolist())


def test_the_epoch_means_weigh_every_sample_of_every_interval():
    task = Classification()
    intervals, records = _interval(task)
    batches = list(_batches(task, 6, seed=3))
    for step, (outputs, targets, loss) in enumerate(batches, start=1):
        intervals.add(task.stats(outputs, targets, loss), loss, step)
        intervals.steps += 1
        if step in (2, 6):  # intervals of 2 and 4 steps
            intervals.close_and_reduce(step, epoch=1, lr=0.1, stop_requested=False)
            intervals.read_reduction()
    weighted = (records[0]["loss"] * 2 + records[1]["loss"] * 4) / 6
    assert intervals.epoch_means()["loss"] == pytest.approx(weighted, rel=1e-12)
    intervals.new_epoch()
    assert intervals.epoch_means() is None


def test_a_non_finite_loss_stops_the_run_naming_its_step():
    task = Classification()
    intervals, records = _interval(task)
    for step, (outputs, targets, loss) in enumerate(_batches(task, 4), start=1):
        if step == 3:
            loss = loss * float("nan")
        intervals.add(task.stats(outputs, targets, loss), loss, step)
        intervals.steps += 1
    with pytest.raises(JobFailed, match="NaN or inf at step 3"):
        intervals.flush(4, epoch=1, lr=0.1, stop_requested=False)
    assert records == []  # nothing is recorded from the interval that held it


def test_a_stop_request_is_agreed_when_its_interval_is_read_and_flush_records_the_rest():
    task = Classification()
    intervals, records = _interval(task)
    batches = _batches(task, 3)
    outputs, targets, loss = next(batches)
    intervals.add(task.stats(outputs, targets, loss), loss, 1)
    intervals.steps += 1
    intervals.close_and_reduce(1, epoch=1, lr=0.1, stop_requested=True)
    assert not intervals.stop_agreed
    outputs, targets, loss = next(batches)
    intervals.add(task.stats(outputs, targets, loss), loss, 2)
    intervals.steps += 1
    intervals.read_reduction()
    assert intervals.stop_agreed and [r["step"] for r in records] == [1]
    intervals.flush(2, epoch=1, lr=0.1, stop_requested=True)  # a save: the open interval is recorded at once
    intervals.flush(2, epoch=1, lr=0.1, stop_requested=True)  # nothing left: no empty record
    assert [r["step"] for r in records] == [1, 2]
