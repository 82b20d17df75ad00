"""``mgpu runs``' reader (mgpucli/postmortem/run_summary.py) on hand-written run dirs, and the command in-process.

Run dirs without a launch record (what ``mgpu train`` alone leaves) are written here by hand; the states of real
launches (finished, preempted, failed) are tests/e2e/test_runs.py's.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from mgpucli.cli.runs import duration
from mgpucli.errors import UsageError
from mgpucli.postmortem.run_summary import curve, find_runs, list_runs, metric_names, read_records, summarize
from tests.inproc import cli
from tests.procs import assert_usage_error

T0 = 1796586211.0


def train(step: int, loss: float, **more) -> dict:
    return {"split": "train", "step": step, "epoch": 1, "loss": loss, "accuracy": 0.5, "samples_per_s": 2389.6,
            "lr": 0.05, "time": T0 + step, **more}


def val(step: int, loss: float, accuracy: float) -> dict:
    return {"split": "val", "step": step, "epoch": 1, "loss": loss, "accuracy": accuracy, "samples": 1001,
            "time": T0 + step + 0.5}


def write_run(path: Path, records: list[dict], recipe: str | None = "trainer:\n  best_metric: accuracy\n",
              torn: bool = False) -> Path:
    path.mkdir(parents=True)
    text = "".join(json.dumps(r) + "\n" for r in records)
    (path / "metrics.jsonl").write_text(text + ('{"split": "train", "st' if torn else ""))
    if recipe is not None:
        (path / "recipe.yaml").write_text(recipe)
    return path


RECORDS = [train(10, 0.9), val(10, 0.50, 0.70), {"split": "event", "event": "segment", "step": 10},
           train(20, 0.5), val(20, 0.30, 0.90), train(30, 0.4), val(30, 0.35, 0.85)]


def test_a_torn_last_line_and_events_are_read_around(tmp_path):
    run = write_run(tmp_path / "a", RECORDS, torn=True)
    assert len(read_records(run)) == len(RECORDS)
    assert metric_names(read_records(run)) == ["accuracy", "loss"]
    assert metric_names(read_records(run), "train") == ["accuracy", "loss", "lr", "samples_per_s"]
    assert curve(run, "accuracy") == [(10, 0.70), (20, 0.90), (30, 0.85)]
    assert curve(run, "lr", "train") == [(10, 0.05), (20, 0.05), (30, 0.05)]


def test_a_resumed_run_recording_a_step_again_keeps_the_latest_value(tmp_path):
    run = write_run(tmp_path / "a", [val(10, 0.5, 0.7), val(20, 0.4, 0.8), val(20, 0.3, 0.9)])
    assert curve(run, "loss") == [(10, 0.5), (20, 0.3)]


def test_the_best_follows_the_recipes_metric_and_mode(tmp_path):
    s = summarize(write_run(tmp_path / "acc", RECORDS))
    assert (s.metric, s.mode, s.best, s.best_step) == ("accuracy", "max", 0.90, 20)
    assert s.last_val == RECORDS[-1] and s.step == 30 and s.epoch == 1 and s.seconds == 30.5 - 10
    loss = summarize(write_run(tmp_path / "loss", RECORDS, recipe="trainer:\n  best_metric: loss\n"))
    assert (loss.metric, loss.mode, loss.best, loss.best_step) == ("loss", "min", 0.30, 20)
    forced = summarize(write_run(tmp_path / "m", RECORDS, "trainer:\n  best_metric: accuracy\n  best_mode: min\n"))
    assert (forced.mode, forced.best, forced.best_step) == ("min", 0.70, 10)
    asked = summarize(tmp_path / "acc", metric="loss")  # another metric than the recipe's: its own auto mode
    assert (asked.metric, asked.mode, asked.best) == ("loss", "min", 0.30)
    none = summarize(write_run(tmp_path / "none", RECORDS, recipe=None))  # no best_metric: loss, where validated
    assert (none.metric, none.mode, none.best) == ("loss", "min", 0.30)


def test_a_run_without_a_launch_record_is_unknown_unless_its_records_show_the_end(tmp_path):
    s = summarize(write_run(tmp_path / "alone", RECORDS))
    assert (s.status, s.exit_code, s.launched, s.cause) == ("unknown", None, False, None)
    assert "no launch record" in s.verdict and "step 30" in s.verdict
    stop = {"split": "stop", "step": 30, "epoch": 1, "reason": "early_stopping", "metric": "loss"}
    early = summarize(write_run(tmp_path / "early", [*RECORDS, stop]))
    assert (early.status, early.exit_code) == ("succeeded", 0) and "finished at step 30" in early.verdict
    json.dumps(early.to_json())  # plain data


def test_runs_are_found_at_any_depth_sweep_trials_included(tmp_path):
    root = tmp_path / "runs"
    write_run(root / "a", RECORDS)
    write_run(root / "a" / "logs" / "inner", RECORDS)  # inside a run dir: not searched
    (root / "sweep").mkdir(parents=True)
    (root / "sweep" / "sweep.json").write_text("{}")
    write_run(root / "sweep" / "t1", RECORDS)
    (root / "sweep" / "t0" / "checkpoints").mkdir(parents=True)
    (root / "sweep" / "t0" / "checkpoints" / "last.pt").write_bytes(b"")
    write_run(root / ".hidden", RECORDS)
    (root / "empty" / "deeper").mkdir(parents=True)
    assert find_runs(root) == [root / "a", root / "sweep" / "t0", root / "sweep" / "t1"]
    assert find_runs(root / "a") == [root / "a"]
    assert [s.name for s in list_runs(root)] == ["a", "sweep/t0", "sweep/t1"]
    assert summarize(root / "a").name == "a"


def _sorted(root: Path, key: str) -> list[str]:
    return [s.name for s in list_runs(root, key)]


def test_sorting_by_a_metric_its_mode_first_runs_without_it_last(tmp_path):
    write_run(tmp_path / "low", [val(10, 0.9, 0.6), train(40, 0.8)])
    write_run(tmp_path / "high", [val(10, 0.2, 0.95), train(20, 0.3)])
    write_run(tmp_path / "mid", [val(10, 0.5, 0.80)])
    write_run(tmp_path / "never", [train(10, 1.0)])
    assert _sorted(tmp_path, "accuracy") == ["high", "mid", "low", "never"]
    assert _sorted(tmp_path, "loss") == ["high", "mid", "low", "never"]
    assert _sorted(tmp_path, "step") == ["low", "high", "mid", "never"]
    assert _sorted(tmp_path, "name") == ["high", "low", "mid", "never"]
    assert _sorted(tmp_path, "time") == ["high", "low", "mid", "never"]  # shortest first; one record: none, last


@pytest.mark.parametrize("make, fragment", [
    (lambda p: p / "missing", "no such directory"),
    (lambda p: (p / "file").write_text("x") and p / "file", "is a file"),
    (lambda p: p, "no run under"),
])
def test_a_directory_without_runs_is_refused(tmp_path, make, fragment):
    with pytest.raises(UsageError, match=fragment) as err:
        list_runs(make(tmp_path))
    assert err.value.exit_code == 2 and "mgpu runs runs" in err.value.hint


def test_the_command_lists_sorts_and_prints_json(tmp_path):
    write_run(tmp_path / "runs" / "b", RECORDS)
    write_run(tmp_path / "runs" / "a", [val(10, 0.2, 0.99)])
    r = cli("runs", cwd=tmp_path)
    assert r.returncode == 0, r.output
    assert "best accuracy" in r.stdout and "unknown" in r.stdout and r.stdout.index(" a ") < r.stdout.index(" b ")
    assert "2 run(s) under runs" in r.stderr
    r = cli("runs", "--json", "--sort", "loss", cwd=tmp_path)
    assert r.returncode == 0, r.output
    listed = json.loads(r.stdout)
    assert [(s["name"], s["metric"], s["best"]) for s in listed["runs"]] == [("a", "loss", 0.2), ("b", "loss", 0.3)]


def test_the_plot_draws_each_runs_curve(tmp_path):
    write_run(tmp_path / "runs" / "b", RECORDS)
    write_run(tmp_path / "runs" / "a", [train(10, 0.2)])
    r = cli("runs", "--plot", "accuracy", cwd=tmp_path)
    assert r.returncode == 0, r.output
    plot = r.stdout[r.stdout.index("val accuracy"):]
    assert "┤" in plot and "• b" in plot and "step" in plot and "\x1b[" not in plot
    assert "no val accuracy recorded (not drawn): a" in r.stderr
    lr = cli("runs", "--plot", "lr", cwd=tmp_path)  # a training-only metric: its training records
    assert lr.returncode == 0 and "train lr" in lr.stdout, lr.output


@pytest.mark.parametrize("args, fragments", [
    (["nowhere"], ["nowhere: no such directory", "mgpu runs runs"]),
    (["--sort", "f1"], ["--sort f1: no run under runs records a validation metric named 'f1'",
                        "validation: accuracy, loss", "sort by step, time or name"]),
    (["--plot", "f1"], ["--plot f1", "training: accuracy, loss, lr, samples_per_s"]),
    (["--plot", "loss", "--json"], ["give one of them"]),
])
def test_bad_input_is_exit_2_naming_the_fix(tmp_path, args, fragments):
    write_run(tmp_path / "runs" / "a", RECORDS)
    assert_usage_error(cli("runs", *args, cwd=tmp_path), *fragments)


def test_durations_read_as_a_person_says_them():
    assert [duration(s) for s in (None, 4.04, 192, 7500)] == ["", "4.0 s", "3 min 12 s", "2 h 05 min"]
