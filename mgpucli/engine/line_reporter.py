"""Rank 0's report as plain lines on stderr, for output that no terminal reads: log files, CI, pipes, and every
``mgpu launch`` worker (torch's agent sends their output to files; the launcher shows rank 0's).

It writes what ``mgpu train``'s progress bar on a terminal writes, without the bar and without importing rich,
which a worker writing to files does not need; the line formats here are shared by both.
"""

from __future__ import annotations

import sys
from typing import Any


def fmt(metrics: dict[str, Any] | None, skip: tuple[str, ...] = ()) -> str:
    if not metrics:
        return "-"
    return "  ".join(f"{k} {v:.4g}" for k, v in metrics.items()
                     if isinstance(v, float) and k not in skip)


def start_lines(info: dict[str, Any]) -> tuple[str, str]:
    """The banner: who trains what, where, and the batch arithmetic."""
    threads = f", {info['cpu_threads']} thread(s)/process" if info.get("cpu_threads") else ""
    return (
        f"{info['name']}: {info['world_size']} process(es) on {info['device']} (backend {info['backend']}, "
        f"strategy {info['strategy']}{threads}, precision {info['precision']})",
        f"global batch {info['global_batch']} = {info['batch_size']} per process x {info['world_size']} "
        f"process(es) x {info['grad_accum']} accumulation step(s); {info['train_samples']} train / "
        f"{info['val_samples']} val samples, {info['steps_per_epoch']} steps per epoch; run dir {info['run_dir']}",
    )


def train_line(record: dict[str, Any]) -> str:
    tokens = f", {record['tokens_per_s']:.0f} tokens/s" if "tokens_per_s" in record else ""
    skip = ("lr", "time", "samples_per_s", "tokens", "tokens_per_s")
    return (f"step {record['step']} epoch {record['epoch']}  {fmt(record, skip=skip)}  "
            f"{record['samples_per_s']:.0f} samples/s{tokens}")


def val_line(record: dict[str, Any]) -> str:
    weights = ", EMA weights" if record.get("weights") == "ema" else ""
    tokens = f", {record['tokens']} tokens" if "tokens" in record else ""
    return (f"step {record['step']}  {fmt(record, skip=('time', 'tokens'))}  "
            f"({record['samples']} samples{tokens}{weights})")


TABLE_TITLE = "per-epoch metrics (train: the epoch's mean over all its samples; val: the validation after it)"


def epoch_line(epoch: int, train: dict[str, Any] | None, val: dict[str, Any] | None) -> str:
    """``epoch N done`` (epochs are numbered from 1), the epoch's train means and the validation after it."""
    return f"epoch {epoch} done  train (epoch mean): {fmt(train)}  val: {fmt(val)}"


def table_columns(rows: list[tuple[int, dict | None, dict | None]]) -> tuple[list[str], list[list[str]]]:
    """The closing per-epoch table as header + cells: every float metric of train and val, 4 decimals."""
    names = sorted({k for _, t, v in rows for d in (t, v) if d for k in d if isinstance(d[k], float)})
    header = ["epoch"] + [f"{split} {n}" for split in ("train", "val") for n in names]
    cells = []
    for epoch, train, val in rows:
        row = [str(epoch)]
        for d in (train, val):
            row += [f"{d[n]:.4f}" if d and isinstance(d.get(n), float) else "-" for n in names]
        cells.append(row)
    return header, cells


class LineReporter:
    """Implements mgpucli.engine.reporter.Reporter with print(), on stderr."""

    def __init__(self) -> None:
        self.rows: list[tuple[int, dict | None, dict | None]] = []

    @staticmethod
    def _print(text: str) -> None:
        print(text, file=sys.stderr, flush=True)

    def start(self, info: dict[str, Any]) -> None:
        first, second = start_lines(info)
        self._print(f"mgpu train {first}")
        self._print(second)

    def epoch_start(self, epoch: int, steps: int, done: int) -> None:
        pass

    def step(self, step: int) -> None:
        pass

    def log(self, record: dict[str, Any]) -> None:
        self._print(train_line(record) if record["split"] == "train" else f"val {val_line(record)}")

    def epoch_end(self, epoch: int, train: dict[str, Any] | None, val: dict[str, Any] | None) -> None:
        self.rows.append((epoch, train, val))
        self._print(epoch_line(epoch, train, val))

    def message(self, text: str) -> None:
        self._print(text)

    def warn(self, text: str) -> None:
        self._print(f"warning: {text}")

    def close(self) -> None:
        if not self.rows:
            return
        header, cells = table_columns(self.rows)
        widths = [max(len(h), *(len(r[i]) for r in cells)) for i, h in enumerate(header)]
        self._print(TABLE_TITLE)
        for row in (header, *cells):
            self._print("  ".join(c.rjust(w) for c, w in zip(row, widths, strict=True)))
