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


class _Counting(Classification):
    """The built-in classification task, counting its ``stats`` calls."""

    def __init__(self):
        self.calls = 0

    def stats(self, outputs, targets, loss=None):
        self.calls += 1
        return super().stats(outputs, targets, loss)


def _record_of(task, batches, add_step: bool):
    intervals, records = _interval(task)
    for step, (outputs, targets, loss) in enumerate(batches, start=1):
        if add_step:
            intervals.add_step(outputs, targets, loss, step)
        else:
            intervals.add(task.stats(outputs, targets, loss), loss, step)
        intervals.steps += 1
    calls_before_close = getattr(task, "calls", None)
    intervals.flush(len(batches), epoch=1, lr=0.1, stop_requested=False)
    return records[0], calls_before_close


def test_small_batches_are_added_once_at_the_interval_with_the_same_sums():
    batches = list(_batches(Classification(), 6, seed=5))
    per_step, _ = _record_of(Classification(), batches, add_step=False)
    counting = _Counting()
    batched, calls_before_close = _record_of(counting, batches, add_step=True)
    assert calls_before_close == 0  # no stats op on the step path
    assert counting.calls == 1  # one call for the interval's 6 steps
    assert batched["accuracy"] == per_step["accuracy"]
    assert batched["loss"] == pytest.approx(per_step["loss"], rel=1e-6)


def test_batches_of_another_shape_are_added_apart_and_large_outputs_at_once():
    counting = _Counting()
    gen = torch.Generator().manual_seed(1)
    batches = [(torch.randn(n, 4, generator=gen), torch.randint(4, (n,), generator=gen)) for n in (8, 8, 5)]
    batches = [(o, t, counting.loss(o, t).detach()) for o, t in batches]
    per_step, _ = _record_of(Classification(), batches, add_step=False)
    batched, _ = _record_of(counting, batches, add_step=True)
    assert counting.calls == 2  # the two batches of 8 together, the last (partial) batch of 5 alone
    assert batched["accuracy"] == per_step["accuracy"]
    assert batched["loss"] == pytest.approx(per_step["loss"], rel=1e-6)

    large = _Counting()
    outputs = torch.randn(5000, 4, generator=gen)  # 20000 elements: summed on its step
    intervals, _ = _interval(large)
    intervals.add_step(outputs, torch.randint(4, (5000,), generator=gen), large.loss(outputs, outputs.argmax(-1)), 1)
    assert large.calls == 1 and intervals.pending == []


def test_a_task_that_does_not_say_its_sums_add_up_is_summed_on_every_step():
    class Duck:  # a custom task by duck typing: the four members, no batched_stats
        stat_names = ("loss_sum", "samples")

        def __init__(self):
            self.calls = 0

        def loss(self, outputs, targets):
            return torch.nn.functional.cross_entropy(outputs, targets)

        def stats(self, outputs, targets, loss=None):
            self.calls += 1
            return torch.stack([loss.double() * targets.shape[0], torch.tensor(float(targets.shape[0]),
                                                                               dtype=torch.float64)])

        def metrics(self, sums):
            return {"loss": sums[0] / max(sums[1], 1)}

    duck = Duck()
    intervals, _ = _interval(duck)
    for step, (outputs, targets, loss) in enumerate(_batches(Classification(), 3), start=1):
        intervals.add_step(outputs, targets, loss, step)
        assert duck.calls == step
