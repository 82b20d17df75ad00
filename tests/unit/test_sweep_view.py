"""mgpu sweep's live table and lines, drawn from a sweep's record and its trials' progress files (no process)."""

from __future__ import annotations

import io
import json
import time
from types import SimpleNamespace

import pytest
from rich.console import Console

from mgpucli.cli import sweep_view
from mgpucli.sweep import record as records
from mgpucli.sweep.grid import expand
from mgpucli.sweep.slots import Slot
from mgpucli.sweep.trials import Running


@pytest.fixture
def screen(monkeypatch):
    out = io.StringIO()
    console = Console(file=out, force_terminal=True, width=160, color_system=None)
    monkeypatch.setattr(sweep_view, "err_console", lambda: console)
    return out


def _running(tmp_path, rec, index: int, progress: dict, vals: list[float]) -> Running:
    trial = rec.trials[index]
    run_dir = tmp_path / trial.name
    run_dir.mkdir(parents=True)
    (run_dir / "metrics.jsonl").write_text("".join(
        json.dumps({"split": "val", "step": 10 * (i + 1), "accuracy": v}) + "\n" for i, v in enumerate(vals))
        + '{"split": "val", "step": 99, "accura')  # a line still being written
    trial.run_dir, trial.state, trial.slot, trial.started = str(run_dir), "running", f"cpu{index}", time.time() - 10
    path = tmp_path / f"{trial.name}.progress.json"
    path.write_text(json.dumps(progress))
    return Running(trial, Slot(index), SimpleNamespace(poll=lambda: None), str(path), io.StringIO())


def test_the_table_shows_each_trials_state_step_of_total_and_metrics_and_the_time_left(tmp_path, screen):
    rec = records.new("lr", "quickstart", expand(["optim.lr=0.1,0.01,0.001"]), str(tmp_path), "accuracy", "max")
    view = sweep_view.TableView(rec)
    first = _running(tmp_path, rec, 0, {"epoch": 2, "steps": 100, "done": 50, "total_epochs": 4}, [0.5, 0.7, 0.6])
    view.started(first)
    view.close()
    drawn = screen.getvalue()
    assert "sweep lr" in drawn and "0-lr=0.1" in drawn and "optim.lr=0.001" in drawn
    assert "150/400" in drawn  # epoch 2 of 4, 50 of its 100 steps done
    assert "0.6 " in drawn and "0.7 " in drawn  # latest and best accuracy; the torn line is not read
    assert "1 running, 2 queued" in drawn.replace("2 queued, 1 running", "1 running, 2 queued")
    assert "left" in drawn  # 10 s for 150 of 400 steps: the rest of it, and two queued trials like it


def test_without_a_terminal_a_line_per_trial_start_and_end(tmp_path, screen):
    rec = records.new("lr", "quickstart", expand(["optim.lr=0.1,0.01"]), str(tmp_path), "accuracy", "max")
    view = sweep_view.LineView(rec, note="GPU 3 stay(s) idle")
    run = _running(tmp_path, rec, 1, {}, [0.8])
    view.started(run)
    run.trial.end(1, time.time())
    run.trial.cause = "the loss became NaN or inf at step 3"
    view.ended(run)
    said = screen.getvalue().splitlines()
    assert said == ["note: GPU 3 stay(s) idle", "sweep lr: trial 1-lr=0.01 started on cpu1: optim.lr=0.01",
                    "sweep lr: trial 1-lr=0.01 failed (exit 1) in 10 s: the loss became NaN or inf at step 3"]
