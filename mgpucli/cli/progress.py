"""The rich reporter for rank 0: start banner, a progress bar refreshed on a timer, per-epoch lines, and a
closing table. Without a terminal (CI, log files) it prints one line per log interval instead of a bar.
"""

from __future__ import annotations

from typing import Any

from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn
from rich.table import Table

from mgpucli.console import err_console


def _fmt(metrics: dict[str, Any] | None, skip: tuple[str, ...] = ()) -> str:
    if not metrics:
        return "-"
    return "  ".join(f"{k} {v:.4g}" for k, v in metrics.items()
                     if isinstance(v, float) and k not in skip)


class RichReporter:
    """Implements mgpucli.engine.report.Reporter with rich, on stderr."""

    def __init__(self) -> None:
        self.console = err_console()
        self.live = self.console.is_terminal
        self.progress: Progress | None = None
        self.task = None
        self.rows: list[tuple[int, dict | None, dict | None]] = []
        self.offset = 0

    def start(self, info: dict[str, Any]) -> None:
        c = self.console
        threads = f", {info['cpu_threads']} thread(s)/process" if info.get("cpu_threads") else ""
        c.print(f"[bold]mgpu train[/] {info['name']}: {info['world_size']} process(es) on {info['device']} "
                f"(backend {info['backend']}, strategy {info['strategy']}{threads}, precision {info['precision']})")
        c.print(f"global batch {info['global_batch']} = {info['batch_size']} per process x {info['world_size']} "
                f"process(es) x {info['grad_accum']} accumulation step(s); {info['train_samples']} train / "
                f"{info['val_samples']} val samples, {info['steps_per_epoch']} steps per epoch; "
                f"run dir {info['run_dir']}")

    def epoch_start(self, epoch: int, steps: int, done: int) -> None:
        if not self.live:
            return
        if self.progress is None:
            self.progress = Progress(
                TextColumn("epoch {task.fields[epoch]}"), BarColumn(), MofNCompleteColumn(),
                TextColumn("loss {task.fields[loss]}"), TextColumn("{task.fields[speed]} samples/s"),
                TimeRemainingColumn(), console=self.console, refresh_per_second=4, transient=True,
            )
            self.progress.start()
        if self.task is not None:
            self.progress.remove_task(self.task)
        self.offset = None
        self.task = self.progress.add_task("train", total=steps, completed=done, epoch=epoch, loss="-", speed="-")
        self._done = done

    def step(self, step: int) -> None:
        if self.progress is not None:
            self.progress.advance(self.task)

    def log(self, record: dict[str, Any]) -> None:
        if record["split"] == "train":
            if self.progress is not None:
                self.progress.update(self.task, loss=f"{record['loss']:.4f}", speed=f"{record['samples_per_s']:.0f}")
            else:
                self.console.print(f"step {record['step']} epoch {record['epoch']}  "
                                   f"{_fmt(record, skip=('lr', 'time', 'samples_per_s'))}  "
                                   f"{record['samples_per_s']:.0f} samples/s")
        else:
            self.console.print(f"[cyan]val[/] step {record['step']}  {_fmt(record, skip=('time',))}  "
                               f"({record['samples']} samples)")

    def epoch_end(self, epoch: int, train: dict[str, Any] | None, val: dict[str, Any] | None) -> None:
        self.rows.append((epoch, train, val))
        self.console.print(f"epoch {epoch} done  train: {_fmt(train)}  val: {_fmt(val)}")

    def message(self, text: str) -> None:
        self.console.print(text, markup=False)

    def warn(self, text: str) -> None:
        self.console.print("[yellow]warning:[/] ", end="")
        self.console.print(text, markup=False)

    def close(self) -> None:
        if self.progress is not None:
            self.progress.stop()
            self.progress = None
        if not self.rows:
            return
        names = sorted({k for _, t, v in self.rows for d in (t, v) if d for k in d if isinstance(d[k], float)})
        table = Table(title="per-epoch metrics")
        table.add_column("epoch", justify="right")
        for split in ("train", "val"):
            for n in names:
                table.add_column(f"{split} {n}", justify="right")
        for epoch, train, val in self.rows:
            cells = [str(epoch)]
            for d in (train, val):
                cells += [f"{d[n]:.4f}" if d and isinstance(d.get(n), float) else "-" for n in names]
            table.add_row(*cells)
        self.console.print(table)
