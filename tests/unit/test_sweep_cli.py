"""mgpu sweep's refusals through its command, in the test process: exit 2, every problem named with its trial's
values, nothing started, nothing written."""

from __future__ import annotations

from mgpucli.sweep import record as records
from mgpucli.sweep.grid import expand
from tests.inproc import cli
from tests.procs import assert_usage_error


def test_values_that_cannot_compose_are_all_named_with_their_trials_and_nothing_is_written(tmp_path):
    r = cli("sweep", "--cpu", "quickstart", "trainer.epochs=1,abc", "optim.lr=0.1,-1", cwd=tmp_path)
    assert_usage_error(r, "problem(s) in the sweep's trials of recipe quickstart",
                       "trial 2 (trainer.epochs=abc optim.lr=0.1): trainer.epochs",
                       "trial 1 (trainer.epochs=1 optim.lr=-1)", "nothing was started or written")
    assert "trial 0 " not in r.stderr  # the trial without a problem is not named
    assert list(tmp_path.iterdir()) == []


def test_a_metric_the_task_does_not_report_is_refused_with_the_close_one(tmp_path):
    r = cli("sweep", "--cpu", "quickstart", "optim.lr=0.1,0.01", "--metric", "accurcy", cwd=tmp_path)
    assert_usage_error(r, "--metric: 'accurcy' is not a metric the task reports", "did you mean 'accuracy'?")
    assert list(tmp_path.iterdir()) == []


def test_a_folder_that_holds_a_run_is_not_taken_for_a_sweep(tmp_path):
    (tmp_path / "runs/quickstart-sweep").mkdir(parents=True)
    (tmp_path / "runs/quickstart-sweep/metrics.jsonl").write_text("{}\n")
    r = cli("sweep", "--cpu", "quickstart", "optim.lr=0.1,0.01", cwd=tmp_path)
    assert_usage_error(r, "runs/quickstart-sweep already exists and holds no sweep (sweep.json)", "--name NAME")


def test_other_values_under_a_sweep_name_are_refused_and_its_record_kept(tmp_path):
    sweep_dir = tmp_path / "runs/lr"
    sweep_dir.mkdir(parents=True)
    records.new("lr", "quickstart", expand(["optim.lr=0.1,0.01"]), "runs/lr", "accuracy", "max").save(str(sweep_dir))
    before = (sweep_dir / "sweep.json").read_text()
    r = cli("sweep", "--cpu", "--name", "lr", "quickstart", "optim.lr=0.5,0.05", cwd=tmp_path)
    assert_usage_error(r, "runs/lr holds another sweep", "optim.lr=0.1,0.01 then, optim.lr=0.5,0.05 now")
    assert (sweep_dir / "sweep.json").read_text() == before


def test_a_name_that_is_no_directory_name_is_refused(tmp_path):
    r = cli("sweep", "--cpu", "--name", "../up", "quickstart", "optim.lr=0.1,0.01", cwd=tmp_path)
    assert_usage_error(r, "--name '../up': a sweep's name is a directory name under runs/", "--name lr-sweep")


def test_a_finished_sweep_run_again_starts_nothing_and_shows_its_summary(tmp_path):
    sweep_dir = tmp_path / "runs/done"
    sweep_dir.mkdir(parents=True)
    grid = ["model.hidden=[64],[32]"]
    rec = records.new("done", "quickstart", expand(grid), "runs/done", "accuracy", "max")
    for i, trial in enumerate(rec.trials):
        trial.end(0, 1.0)
        trial.best, trial.best_step = 0.5 + i / 10, 10
    rec.save(str(sweep_dir))
    r = cli("sweep", "--cpu", "--name", "done", "quickstart", *grid, cwd=tmp_path)
    assert r.returncode == 0, r.output
    assert "continuing (2 finished)" in r.stderr
    assert "best: trial 1-hidden=32 (model.hidden=[32]), accuracy 0.6" in r.stderr


def test_a_grid_continued_with_another_metric_compares_every_trial_by_it(tmp_path):
    import json

    sweep_dir = tmp_path / "runs/m"
    rec = records.new("m", "quickstart", expand(["optim.lr=0.1,0.01"]), "runs/m", "accuracy", "max")
    for trial, loss in zip(rec.trials, (0.5, 0.2), strict=True):
        (tmp_path / trial.run_dir).mkdir(parents=True)
        (tmp_path / trial.run_dir / "metrics.jsonl").write_text(
            json.dumps({"split": "val", "step": 5, "loss": loss, "accuracy": 0.9}) + "\n")
        trial.end(0, 1.0)
        trial.best, trial.best_step = 0.9, 5
    rec.save(str(sweep_dir))
    r = cli("sweep", "--cpu", "--name", "m", "quickstart", "optim.lr=0.1,0.01", "--metric", "loss", cwd=tmp_path)
    assert r.returncode == 0, r.output
    assert "best: trial 1-lr=0.01 (optim.lr=0.01), loss 0.2 at step 5" in r.stderr
    saved = records.load(str(sweep_dir))
    assert (saved.metric, saved.mode, [t.best for t in saved.trials]) == ("loss", "min", [0.5, 0.2])
