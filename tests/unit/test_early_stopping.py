"""Early stopping's verdicts (engine/early_stopping.py): pure logic on validation records."""

from __future__ import annotations

import pytest

from mgpucli.config.schema import TASK_METRICS
from mgpucli.engine import tasks
from mgpucli.engine.early_stopping import EarlyStopping, metric_names, resolve_mode
from mgpucli.errors import UsageError


def run(stopping: EarlyStopping, values: list[float], name: str = "loss") -> list[bool]:
    return [stopping.observe({name: v}, step) for step, v in enumerate(values, start=1)]


def test_patience_counts_validations_in_a_row_without_improvement():
    stopping = EarlyStopping("loss", patience=2)
    assert run(stopping, [1.0, 0.9, 0.95, 0.8, 0.85, 0.81]) == [False, False, False, False, False, True]
    assert (stopping.best, stopping.best_step, stopping.wait) == (0.8, 4, 2)
    assert "val loss has not improved for 2 validation(s) in a row (patience 2); best 0.8 at step 4" in \
        stopping.reason()


def test_min_delta_and_max_mode():
    stopping = EarlyStopping("accuracy", patience=1, min_delta=0.05)
    assert stopping.mode == "max"
    assert run(stopping, [0.5, 0.54], "accuracy") == [False, True]  # +0.04 is not more than 0.05
    assert "by more than 0.05" in stopping.reason()


def test_a_metric_that_is_not_finite_stops_at_once():
    stopping = EarlyStopping("loss", patience=5)
    assert run(stopping, [1.0, float("nan")]) == [False, True]
    assert stopping.reason() == "early stopping: val loss is not finite"


def test_the_same_step_validated_twice_counts_once():
    stopping = EarlyStopping("loss", patience=2)
    stopping.observe({"loss": 1.0}, 10)
    assert not stopping.observe({"loss": 2.0}, 20)
    assert not stopping.observe({"loss": 2.0}, 20)  # a run resumed where max_steps ended it validates step 20 again
    assert stopping.wait == 1


def test_state_round_trips_and_another_metric_starts_afresh():
    stopping = EarlyStopping("loss", patience=3)
    run(stopping, [1.0, 2.0])
    again = EarlyStopping("loss", patience=3)
    assert again.load_state_dict(stopping.state_dict())
    assert (again.best, again.wait, again.last_step) == (1.0, 1, 2)
    other = EarlyStopping("accuracy", patience=3)
    assert not other.load_state_dict(stopping.state_dict()) and other.best is None


def test_modes_follow_the_metric_name():
    assert [resolve_mode(n, "auto") for n in ("loss", "perplexity", "mae", "accuracy")] == ["min", "min", "min", "max"]
    assert resolve_mode("loss", "max") == "max"


def test_built_in_tasks_report_what_the_schema_checks_against():
    assert {name: tuple(metric_names(cls())) for name, cls in tasks.BUILTIN.items()} == TASK_METRICS


def test_a_custom_tasks_metric_is_checked_when_the_task_exists():
    class Custom(tasks.Task):
        stat_names = ("a", "samples")

        def metrics(self, sums):
            return {"f1": sums[0] / sums[1]}

    EarlyStopping("f1").check_metric(Custom())
    with pytest.raises(UsageError, match=r"'f2' is not a validation metric \(the task reports f1; did you mean 'f1'"):
        EarlyStopping("f2").check_metric(Custom())
