"""Rank 0's two reporters say the same things: plain lines (no terminal) and rich (a terminal)."""

from __future__ import annotations

import io
import re
import sys

import pytest

from mgpucli.cli.progress import RichReporter
from mgpucli.engine.line_reporter import LineReporter

INFO = {"name": "quickstart", "world_size": 2, "device": "cpu", "backend": "gloo", "strategy": "ddp",
        "cpu_threads": 1, "precision": "fp32", "global_batch": 64, "batch_size": 32, "grad_accum": 1,
        "train_samples": 4096, "val_samples": 1001, "steps_per_epoch": 64, "run_dir": "runs/q"}
TRAIN = {"split": "train", "step": 20, "epoch": 1, "loss": 0.79821, "accuracy": 0.718, "lr": 0.05,
         "samples_per_s": 16783.2, "time": 1.0}
VAL = {"split": "val", "step": 64, "epoch": 1, "loss": 0.18384, "accuracy": 0.93806, "samples": 1001, "time": 2.0}


def _drive(reporter) -> None:
    reporter.start(INFO)
    reporter.epoch_start(1, 64, 0)
    reporter.step(1)
    reporter.log(TRAIN)
    reporter.log(VAL)
    reporter.warn("the recipe changed since last.pt was saved: optim.lr")
    reporter.message("resumed from last.pt at step 64 (epoch 1)")
    reporter.epoch_end(1, {"loss": 0.2273, "accuracy": 0.9492}, {"loss": 0.1838, "accuracy": 0.9381})
    reporter.close()


def test_line_reporter_text(capsys):
    _drive(LineReporter())
    lines = capsys.readouterr().err.splitlines()
    assert lines == [
        "mgpu train quickstart: 2 process(es) on cpu (backend gloo, strategy ddp, 1 thread(s)/process, precision "
        "fp32)",
        "global batch 64 = 32 per process x 2 process(es) x 1 accumulation step(s); 4096 train / 1001 val samples, "
        "64 steps per epoch; run dir runs/q",
        "step 20 epoch 1  loss 0.7982  accuracy 0.718  16783 samples/s",
        "val step 64  loss 0.1838  accuracy 0.9381  (1001 samples)",
        "warning: the recipe changed since last.pt was saved: optim.lr",
        "resumed from last.pt at step 64 (epoch 1)",
        "epoch 1 done  train (epoch mean): loss 0.2273  accuracy 0.9492  val: loss 0.1838  accuracy 0.9381",
        "per-epoch metrics (train: the epoch's mean over all its samples; val: the validation after it)",
        "epoch  train accuracy  train loss  val accuracy  val loss",
        "    1          0.9492      0.2273        0.9381    0.1838",
    ]


def test_rich_reporter_says_the_same_lines_on_a_terminal(capsys, monkeypatch):
    from rich.console import Console

    out = io.StringIO()
    console = Console(file=out, force_terminal=True, color_system=None, width=200, soft_wrap=True, highlight=False)
    monkeypatch.setattr("mgpucli.cli.progress.err_console", lambda: console)
    _drive(RichReporter())
    _drive(LineReporter())
    plain = capsys.readouterr().err.splitlines()
    # Without the live bar's cursor moves and line erases, each printed line must be whole.
    rich_lines = [re.sub(r"\x1b\[[0-9;?]*[A-Za-z]|\r", "", line).rstrip() for line in out.getvalue().splitlines()]
    # Every line but the train line (the bar shows it) and the table (rich draws one) reads the same.
    for line in plain[:2] + plain[3:7]:
        assert line in rich_lines, line
    assert not any(line.startswith("step 20 epoch 0") for line in rich_lines)
    assert "per-epoch metrics" in out.getvalue()


@pytest.mark.parametrize("tty", [True, False])
def test_rank0_gets_rich_only_on_a_terminal(monkeypatch, tty):
    from mgpucli.cli.train import rank0_reporter

    monkeypatch.setattr(sys.stderr, "isatty", lambda: tty)
    assert type(rank0_reporter()).__name__ == ("RichReporter" if tty else "LineReporter")


def test_a_launched_workers_rank0_reports_in_plain_lines_and_keeps_the_progress_file(monkeypatch, tmp_path):
    from mgpucli.launch import progress_file, worker

    monkeypatch.delenv(progress_file.ENV, raising=False)
    assert type(worker.rank0_reporter()) is LineReporter
    monkeypatch.setenv(progress_file.ENV, str(tmp_path / "progress.json"))
    reporter = worker.rank0_reporter()
    assert isinstance(reporter, progress_file.ProgressFileReporter) and type(reporter.inner) is LineReporter


@pytest.mark.filterwarnings("ignore:Unable to enable fault handler")  # torch's @record, under capsys
@pytest.mark.parametrize(("rank", "reports"), [(None, True), ("0", True), ("1", False)])
def test_only_rank_0_builds_a_reporter(monkeypatch, rank, reports):
    from mgpucli.engine import run as run_module
    from mgpucli.engine import train_entry

    for name in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.delenv(name, raising=False)
    if rank is not None:
        for name, value in (("RANK", rank), ("LOCAL_RANK", rank), ("WORLD_SIZE", "2"), ("MASTER_ADDR", "127.0.0.1"),
                            ("MASTER_PORT", "29500")):
            monkeypatch.setenv(name, value)
    built, given = [], []
    monkeypatch.setattr(run_module, "run_training", lambda *a, reporter=None, **k: given.append(reporter))
    train_entry.train_recipe("quickstart", [], rank0_reporter=lambda: built.append(True) or "the reporter")
    assert given == (["the reporter"] if reports else [None]) and built == ([True] if reports else [])
