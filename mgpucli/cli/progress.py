"""The rich reporter for rank 0 on a terminal: start banner, a progress bar refreshed on a timer, per-epoch lines,
and a closing table. Without a terminal, rank 0 uses :class:`mgpucli.engine.line_reporter.LineReporter` (the same
text, one line per log interval, no rich import).
"""

from __future__ import annotations

from typing import Any

from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn
from rich.table import Table
from rich.text import Text

from mgpucli.console import err_console
from mgpucli.engine.line_reporter import TABLE_TITLE, epoch_line, start_lines, table_columns, val_line


class RichReporter:
    """Implements mgpucli.engine.reporter.Reporter with rich, on stderr."""

    def __init__(self) -> None:
        self.console = err_console()
        self.progress: Progress | None = None
        self.task = None
        self.rows: list[tuple[int, dict | None, dict | None]] = []
        self.total_epochs: int | None = None

    def start(self, info: dict[str, Any]) -> None:
        self.total_epochs = info.get("total_epochs")
        first, second = start_lines(info)
        self.console.print(Text.assemble(("mgpu train", "bold"), " ", first))
        self.console.print(second, markup=False)

    def epoch_start(self, epoch: int, steps: int, done: int) -> None:
        if self.progress is None:
            self.progress = Progress(
                TextColumn("epoch {task.fields[epoch]}"), BarColumn(), MofNCompleteColumn(),
                TextColumn("loss {task.fields[loss]}"), TextColumn("{task.fields[speed]} samples/s"),
                TimeRemainingColumn(), console=self.console, refresh_per_second=4, transient=True,
            )
            self.progress.start()
        if self.task is not None:
            self.progress.remove_task(self.task)
        shown = f"{epoch}/{self.total_epochs}" if self.total_epochs else str(epoch)
        self.task = self.progress.add_task("train", total=steps, completed=done, epoch=shown, loss="-", speed="-")

    def step(self, step: int) -> None:
        if self.progress is not None:
            self.progress.advance(self.task)

    def log(self, record: dict[str, Any]) -> None:
        if record["split"] == "train":
            if self.progress is not None:
                self.progress.update(self.task, loss=f"{record['loss']:.4f}", speed=f"{record['samples_per_s']:.0f}")
        else:
            # One print per line: between two, the live bar would redraw itself into the middle of it.
            self.console.print(Text.assemble(("val", "cyan"), " ", val_line(record)))

    def epoch_end(self, epoch: int, train: dict[str, Any] | None, val: dict[str, Any] | None) -> None:
        self.rows.append((epoch, train, val))
        self.console.print(epoch_line(epoch, train, val), markup=False)

    def message(self, text: str) -> None:
        self.console.print(text, markup=False)

    def warn(self, text: str) -> None:
        self.console.print(Text.assemble(("warning:", "yellow"), " ", text))

    def close(self) -> None:
        if self.progress is not None:
            self.progress.stop()
            self.progress = None
        if not self.rows:
            return
        header, cells = table_columns(self.rows)
        table = Table(title=TABLE_TITLE)
        for name in header:
            table.add_column(name, justify="right")
        for row in cells:
            table.add_row(*row)
        self.console.print(table)
