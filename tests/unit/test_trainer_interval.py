"""The log interval's reduction, in one process (no process group): the metric sums it reports are Task.stats'
sums, whichever way the task hands in its step stats, and a non-finite loss is caught even when an earlier fold
(an interval longer than FOLD_EVERY micro-steps) already took it off the pending list. Short intervals share one
reduction, and each record is still its own interval's."""

from __future__ import annotations

import pytest
import torch

from mgpucli.config import load_recipe
from mgpucli.distributed import runtime
from mgpucli.distributed.env import RankEnv
from mgpucli.engine import interval
from mgpucli.engine import trainer as trainer_module
from mgpucli.engine.reporter import NullReporter
from mgpucli.engine.tasks import Regression
from mgpucli.errors import JobFailed
from tests.procs import RECIPES


@pytest.fixture
def make_trainer(tmp_path):
    made = []

    def make(*overrides):
        cfg = load_recipe(str(RECIPES / "quickstart.yaml"),
                          [f"run_dir={tmp_path / f'run{len(made)}'}", "trainer.device=cpu", "trainer.log_every=1000",
                           "data.train.num_samples=256", "data.val=null", *overrides])
        tr = trainer_module.Trainer(cfg, runtime.setup(RankEnv(), "cpu", 60, 1), NullReporter())
        tr.setup()
        tr.wrapped.train.train()
        tr._interval_start, tr._interval_steps = 0.0, 0
        made.append(tr)
        return tr

    yield make
    for tr in made:
        tr.close()


def _steps(tr, batches, expected=None):
    """Train on ``batches``; with ``expected``, also add each step's Task.stats (the reference sums) to it."""
    if expected is not None:
        step_stats = tr.task.step_stats

        def recording(outputs, targets, loss):
            expected.add_(tr.task.stats(outputs.detach(), targets, loss))
            return step_stats(outputs, targets, loss)

        tr.task.step_stats = recording
    for batch in batches:
        tr._forward_backward(batch, sync=True)
        tr._optimizer_step()
    if expected is not None:
        tr.task.step_stats = step_stats


@pytest.mark.parametrize("task", ["classification", "regression"])
def test_interval_metrics_are_the_sums_of_task_stats(make_trainer, task):
    """Classification hands in pieces (folded at the interval in one stack), a stats() vector task (Regression
    here, with the MLP's 4 outputs as the target's 4 columns) adds into ``acc`` at every step: both report
    metrics from exactly the sums that Task.stats gives batch by batch."""
    tr = make_trainer()
    if task == "regression":
        tr.task = Regression()
        tr.acc = torch.zeros(len(tr.task.stat_names), dtype=torch.float64)
        tr.epoch_sums = [0.0] * len(tr.task.stat_names)
    batches = [(x, torch.nn.functional.one_hot(y, 4).float() if task == "regression" else y)
               for x, y in list(tr.loaders.train)[:6]]
    expected = torch.zeros(len(tr.task.stat_names), dtype=torch.float64)
    _steps(tr, batches, expected)
    assert tr._acc_dirty == (task == "regression")
    metrics = tr._reduce_and_log()
    assert metrics == tr.task.metrics(expected.tolist())
    assert not tr._step_rows and not tr._losses and not tr._acc_dirty and torch.count_nonzero(tr.acc) == 0
    # the next interval starts from zero: its sums are its own steps' only
    expected.zero_()
    _steps(tr, batches[:3], expected)
    assert tr._reduce_and_log() == tr.task.metrics(expected.tolist())


def test_a_nan_loss_folded_before_the_interval_still_stops_the_run(make_trainer, monkeypatch):
    """Step 2's loss is NaN; a fold at the 4th micro-step takes it off the pending list, and the interval's
    remaining losses are finite: the reduction still names step 2."""
    monkeypatch.setattr(trainer_module, "FOLD_EVERY", 4)
    tr = make_trainer()
    batches = list(tr.loaders.train)
    _steps(tr, batches[:2])
    tr._losses[1] = torch.tensor(float("nan"))  # as if step 2's loss had been NaN (its update stays finite)
    _steps(tr, batches[2:6])  # the fold ran after step 4
    assert tr._bad_folded and tr._loss_steps == [5, 6]
    assert all(torch.isfinite(loss) for loss in tr._losses)
    with pytest.raises(JobFailed, match="NaN or inf at step 2"):
        tr._reduce_and_log()


def test_a_nan_loss_in_the_interval_stops_the_run(make_trainer):
    tr = make_trainer()
    batches = list(tr.loaders.train)
    _steps(tr, batches[:5])
    tr._losses[3] = torch.tensor(float("inf"))
    with pytest.raises(JobFailed, match="NaN or inf at step 4"):
        tr._reduce_and_log()


def test_an_interval_is_logged_by_the_next_step_with_its_own_step_and_lr(make_trainer, monkeypatch):
    """The interval's all-reduce runs while the next step computes: that step logs the record, which carries
    the interval's step, lr and sums; a save, or the end of the epoch, finishes one in flight at once."""
    monkeypatch.setattr(interval, "REDUCE_EVERY_S", 0.0)  # one interval per reduction, however short
    tr = make_trainer("trainer.log_every=4")
    logged = []
    tr._emit = logged.append
    batches = list(tr.loaders.train)
    expected = torch.zeros(len(tr.task.stat_names), dtype=torch.float64)
    _steps(tr, batches[:4], expected)
    lr_at_4 = tr.optimizer.param_groups[0]["lr"]
    assert logged == [] and tr._in_flight is not None and [c.step for c in tr._in_flight.intervals] == [4]
    _steps(tr, batches[4:5])
    assert tr._in_flight is None and len(logged) == 1
    record = logged[0]
    assert record["step"] == 4 and record["lr"] == lr_at_4 != tr.optimizer.param_groups[0]["lr"]
    assert {k: record[k] for k in ("loss", "accuracy")} == tr.task.metrics(expected.tolist())
    _steps(tr, batches[5:8])  # step 8 starts the next one
    assert tr._in_flight is not None and tr._interval_steps == 0
    tr._check_finite()  # what a save does first
    assert tr._in_flight is None and [r["step"] for r in logged] == [4, 8]
    _steps(tr, batches[:2])  # (the shard has 8 batches)
    assert tr._reduce_and_log() is not None and [r["step"] for r in logged] == [4, 8, 10]  # the partial interval


class IntervalSums:
    """Each interval's metrics from Task.stats (the reference), made from the batches as the trainer steps them."""

    def __init__(self, tr, log_every: int):
        self.tr, self.log_every, self.metrics = tr, log_every, []
        self.sums = torch.zeros(len(tr.task.stat_names), dtype=torch.float64)

    def steps(self, batches) -> None:
        for batch in batches:
            _steps(self.tr, [batch], self.sums)
            if self.tr.step % self.log_every == 0:
                self.metrics.append(self.tr.task.metrics(self.sums.tolist()))
                self.sums.zero_()


@pytest.mark.parametrize("task", ["classification", "regression"])
def test_short_intervals_share_a_reduction_and_each_keeps_its_own_record(make_trainer, monkeypatch, task):
    """The first reduction carries one interval; the pace it reads makes the next ones carry MAX_BATCH (here 3).
    Intervals closed in between wait, unlogged, and are then logged in order, each with its own step, lr and
    sums (pieces, or a stats() vector task's ``acc``); a save logs the waiting ones first."""
    monkeypatch.setattr(interval, "MAX_BATCH", 3)
    monkeypatch.setattr(interval, "REDUCE_EVERY_S", 1e9)  # every interval counts as short
    tr = make_trainer("trainer.log_every=2")
    if task == "regression":
        tr.task = Regression()
        tr.acc = torch.zeros(len(tr.task.stat_names), dtype=torch.float64)
        tr.epoch_sums = [0.0] * len(tr.task.stat_names)
    logged, lrs = [], {}
    tr._emit = logged.append
    step = tr._optimizer_step

    def remember_lr():
        metrics = step()
        lrs[tr.step] = tr.optimizer.param_groups[0]["lr"]  # the lr when the step's interval closed
        return metrics

    tr._optimizer_step = remember_lr
    batches = [(x, torch.nn.functional.one_hot(y, 4).float() if task == "regression" else y)
               for x, y in tr.loaders.train]  # 8 batches
    expected = IntervalSums(tr, 2)
    expected.steps(batches[:3])  # step 2 reduced alone, read at step 3
    assert [r["step"] for r in logged] == [2] and tr._batch == 3
    expected.steps(batches[3:7])  # steps 4 and 6 closed, waiting
    assert [r["step"] for r in logged] == [2] and [c.step for c in tr._closed] == [4, 6] and tr._in_flight is None
    expected.steps(batches[7:8])  # step 8: the third, reduced with 4 and 6
    assert [c.step for c in tr._in_flight.intervals] == [4, 6, 8] and not tr._closed
    expected.steps(batches[:2])  # step 9 reads them; step 10 closes the next
    assert [r["step"] for r in logged] == [2, 4, 6, 8] and [c.step for c in tr._closed] == [10]
    tr._check_finite()  # what a save does first
    assert [r["step"] for r in logged] == [2, 4, 6, 8, 10] and not tr._closed and tr._in_flight is None
    assert [{k: r[k] for k in expected.metrics[0]} for r in logged] == expected.metrics
    assert [r["lr"] for r in logged] == [lrs[s] for s in (2, 4, 6, 8, 10)]


def test_a_nan_loss_in_a_shared_reduction_logs_the_intervals_before_it(make_trainer, monkeypatch):
    monkeypatch.setattr(interval, "MAX_BATCH", 3)
    monkeypatch.setattr(interval, "REDUCE_EVERY_S", 1e9)
    tr = make_trainer("trainer.log_every=2")
    logged = []
    tr._emit = logged.append
    batches = list(tr.loaders.train)
    _steps(tr, batches[:7])  # step 2 logged at 3; steps 4 and 6 closed
    assert [c.step for c in tr._closed] == [4, 6]
    tr._closed[1].losses[1] = torch.tensor(float("nan"))  # as if step 6's loss had been NaN
    tr._closed[1].vec[-1] = float("nan")  # ... and so its interval's loss total
    _steps(tr, batches[7:8])  # step 8 reduces 4, 6 and 8
    with pytest.raises(JobFailed, match="NaN or inf at step 6"):
        _steps(tr, batches[:1])  # step 9 reads them
    assert [r["step"] for r in logged] == [2, 4]


def test_a_stop_is_agreed_when_the_shared_reduction_is_read(make_trainer, monkeypatch):
    monkeypatch.setattr(interval, "MAX_BATCH", 3)
    monkeypatch.setattr(interval, "REDUCE_EVERY_S", 1e9)
    tr = make_trainer("trainer.log_every=2")
    batches = list(tr.loaders.train)
    _steps(tr, batches[:4])
    tr.signal_received = "SIGTERM"
    _steps(tr, batches[4:8])  # steps 4 and 6 closed; step 8 starts their reduction, with the stop flag
    assert not tr.stop_agreed
    _steps(tr, batches[:1])
    assert tr.stop_agreed


def test_only_rank_0_hands_in_a_pace(make_trainer, monkeypatch):
    """Every rank takes the next reduction's size from the reduced pace, so only rank 0 adds its own (the others
    add 0.0: the sum is rank 0's value exactly, the same on every rank, and the collectives stay in step). Here
    one process plays rank 1 (no process group: nothing is added to what it hands in)."""
    from dataclasses import replace

    monkeypatch.setattr(interval, "REDUCE_EVERY_S", 1e9)
    tr = make_trainer("trainer.log_every=2")
    batches = list(tr.loaders.train)
    tr.rt = replace(tr.rt, env=replace(tr.rt.env, rank=1))
    _steps(tr, batches[:3])
    assert tr._batch == 1  # a pace of 0: one interval per reduction
    tr.rt = replace(tr.rt, env=replace(tr.rt.env, rank=0))
    _steps(tr, batches[3:5])
    assert tr._batch == interval.MAX_BATCH


@pytest.mark.parametrize(("pace", "batch"), [(0.3, 1), (0.25, 1), (0.1, 2), (0.02, 12), (1e-4, 16), (0.0, 1),
                                             (float("nan"), 1), (float("inf"), 1)])
def test_intervals_per_reduction_fit_the_pace(pace, batch):
    assert interval.intervals_per_reduction(pace) == batch
