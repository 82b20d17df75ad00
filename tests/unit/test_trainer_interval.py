"""The log interval's reduction, in one process (no process group): the metric sums it reports are Task.stats'
sums, whichever way the task hands in its step stats, and a non-finite loss is caught even when an earlier fold
(an interval longer than FOLD_EVERY micro-steps) already took it off the pending list."""

from __future__ import annotations

import pytest
import torch

from mgpucli.config import load_recipe
from mgpucli.dist import runtime
from mgpucli.dist.env import RankEnv
from mgpucli.engine import trainer as trainer_module
from mgpucli.engine.report import NullReporter
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


def test_an_interval_is_logged_by_the_next_step_with_its_own_step_and_lr(make_trainer):
    """The interval's all-reduce runs while the next step computes: that step logs the record, which carries
    the interval's step, lr and sums; a save, or the end of the epoch, finishes one in flight at once."""
    tr = make_trainer("trainer.log_every=4")
    logged = []
    tr._emit = logged.append
    batches = list(tr.loaders.train)
    expected = torch.zeros(len(tr.task.stat_names), dtype=torch.float64)
    _steps(tr, batches[:4], expected)
    lr_at_4 = tr.optimizer.param_groups[0]["lr"]
    assert logged == [] and tr._in_flight is not None and tr._in_flight.step == 4
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
