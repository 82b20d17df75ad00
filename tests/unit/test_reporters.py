"""Rank 0's two reporters say the same things: plain lines (no terminal) and rich (a terminal)."""

from __future__ import annotations

import io
import re
import sys

import pytest

from mgpucli.cli.lines import LineReporter
from mgpucli.cli.progress import RichReporter

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
    from mgpucli.cli import train_run

    monkeypatch.setattr(sys.stderr, "isatty", lambda: tty)
    assert type(train_run._reporter(0)).__name__ == ("RichReporter" if tty else "LineReporter")
    assert train_run._reporter(1) is None
