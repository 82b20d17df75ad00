"""mgpu sweep --search optuna: the space read from Hydra's syntax, trials asked of a real Optuna study (SQLite, in the
test's directory), their validations reported and a trial that falls behind pruned; refusals in-process."""

from __future__ import annotations

import io
import json
from types import SimpleNamespace

import pytest

from mgpucli.errors import UsageError
from mgpucli.sweep import record as records
from mgpucli.sweep.grid import Grid
from mgpucli.sweep.search import SearchSource, space
from mgpucli.sweep.slots import Slot
from mgpucli.sweep.trials import Running
from tests.inproc import cli
from tests.procs import assert_usage_error

optuna = pytest.importorskip("optuna")  # the mgpu[sweep] extra; CI installs it (requirements.txt)


def test_the_space_reads_intervals_log_scales_integer_ranges_and_categories():
    found = space(["optim.lr=tag(log, interval(1e-4,1e-1))", "optim.momentum=interval(0.8,0.99)",
                   "trainer.epochs=range(1,9,2)", "model.hidden=choice([64],[128,128])", "seed=3"])
    assert found.common == ("seed=3",)
    lr, momentum, epochs, hidden = found.params
    assert (lr.kind, lr.low, lr.high, lr.log) == ("float", 1e-4, 0.1, True)
    assert (momentum.kind, momentum.log) == ("float", False)
    assert (epochs.kind, epochs.low, epochs.high, epochs.step) == ("int", 1, 7, 2)
    assert hidden.choices == ("[64]", "[128,128]")
    assert [a["values"] for a in found.axes()] == [["tag(log, interval(0.0001,0.1))"], ["interval(0.8,0.99)"],
                                                   ["range(1,8,2)"], ["choice([64],[128,128])"]]
    checked = found.corners()  # every bound and every category composed before anything starts
    assert [dict(t.values)["trainer.epochs"] for t in checked] == ["1", "7"]
    assert {dict(t.values)["model.hidden"] for t in checked} == {"[64]", "[128,128]"}


@pytest.mark.parametrize("overrides, fragment", [
    (["seed=1"], "Nothing to search"),
    (["trainer.epochs=range(5,1)"], "a searched range is of integers, rising"),
    (["run_dir=x", "optim.lr=interval(0,1)"], "its own run dir"),
])
def test_a_space_that_cannot_be_searched_is_refused(overrides, fragment):
    with pytest.raises(UsageError, match=fragment.replace("(", r"\(")):
        space(overrides)


def _source(tmp_path, budget: int) -> SearchSource:
    tmp_path.mkdir(parents=True, exist_ok=True)  # the sweep's folder, made before its study (sweep.main.held)
    found = space(["optim.lr=tag(log, interval(1e-4,1e-1))"])
    rec = records.new("s", "quickstart", Grid((), (), ()), str(tmp_path), "accuracy", "max")
    rec.search, rec.budget, rec.axes = "optuna", budget, found.axes()
    return SearchSource(rec, found, str(tmp_path))


def _run(trial, accuracies: list[float]) -> Running:
    trial.run_dir = str(trial.run_dir)
    import os

    os.makedirs(trial.run_dir, exist_ok=True)
    with open(os.path.join(trial.run_dir, "metrics.jsonl"), "w") as fh:
        for i, value in enumerate(accuracies):
            fh.write(json.dumps({"split": "val", "step": 10 * (i + 1), "accuracy": value}) + "\n")
    return Running(trial, Slot(0), SimpleNamespace(poll=lambda: None, pid=0), "", io.StringIO())


def test_trials_are_asked_until_the_budget_with_exact_values_and_the_same_ones_again(tmp_path):
    source = _source(tmp_path / "a", budget=3)
    asked = [source.next() for _ in range(3)]
    assert not source.has_next() and [t.index for t in source.record.trials] == [0, 1, 2]
    lr = float(asked[0].values["optim.lr"])
    assert 1e-4 <= lr <= 0.1 and asked[0].name == f"0-lr={lr:.4g}" and asked[0].search_trial == 0
    again = _source(tmp_path / "b", budget=1).next()  # a seeded sampler: the same command, the same values
    assert again.values == asked[0].values


def test_a_trial_whose_validation_falls_behind_is_pruned_and_told_so(tmp_path):
    source = _source(tmp_path, budget=7)
    for _ in range(6):  # MedianPruner judges from the 6th trial on (5 startup trials)
        run = _run(source.next(), [0.9, 0.92])
        assert source.to_prune([run]) == []
        source.next_report = 0.0
        run.trial.end(0, 1.0)
        run.trial.best = 0.92
        source.ended(run)
    behind = _run(source.next(), [0.3])
    assert source.to_prune([behind]) == [behind]
    behind.pruned = True
    behind.trial.end(75, 2.0, signalled=True)
    behind.trial.state = records.PRUNED
    source.ended(behind)
    states = [t.state.name for t in source.study.trials]
    assert states == ["COMPLETE"] * 6 + ["PRUNED"] and source.study.best_value == 0.92


def test_search_options_that_do_not_fit_are_refused_in_process(tmp_path):
    assert_usage_error(cli("sweep", "--cpu", "quickstart", "optim.lr=0.1,0.01", "--trials", "4", cwd=tmp_path),
                       "--trials counts a search's trials; a grid runs every combination")
    assert_usage_error(cli("sweep", "--cpu", "--search", "optuna", "quickstart", "optim.lr=interval(0,1)",
                           cwd=tmp_path), "--search optuna needs the number of trials to run: --trials N")
    assert_usage_error(cli("sweep", "--cpu", "--search", "random", "quickstart", "optim.lr=0.1,0.01", cwd=tmp_path),
                       "--search random: mgpu searches with 'grid'")
    assert list(tmp_path.iterdir()) == []
