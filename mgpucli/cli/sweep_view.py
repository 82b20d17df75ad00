"""``mgpu sweep`` as people watch it: on a terminal one live table (rich), redrawn in place; otherwise (a log file,
CI) one line per trial as it starts and as it ends. Both on stderr."""

from __future__ import annotations

import json
import os
import time
from typing import Any

from mgpucli.console import err_console
from mgpucli.run_layout import METRICS
from mgpucli.sweep.record import FAILED, FINISHED, RUNNING, STOPPED, SweepRecord
from mgpucli.sweep.summary import value
from mgpucli.sweep.trials import Running

_STYLE = {FINISHED: "green", FAILED: "red", STOPPED: "yellow", RUNNING: "cyan"}
REDRAW_S = 1.0  # the table is redrawn at most this often (the trials' exits are seen sooner)


class LineView:
    """One line per trial as it starts and as it ends."""

    def __init__(self, record: SweepRecord, note: str | None = None):
        self.record = record
        self.console = err_console()
        if note:
            self.console.print(f"note: {note}", markup=False)

    def _say(self, text: str) -> None:
        self.console.print(f"sweep {self.record.name}: {text}", markup=False, highlight=False)

    def started(self, run: Running) -> None:
        t = run.trial
        again = f" (again, from its last checkpoint: launch {t.launches})" if t.launches > 1 else ""
        self._say(f"trial {t.name} started on {run.slot.describe()}{again}: {t.describe()}")

    def ended(self, run: Running) -> None:
        t = run.trial
        took = f" in {_duration(t.ended - t.started)}" if t.started and t.ended else ""
        best = f"; best {self.record.metric} {value(t.best)} at step {t.best_step}" if t.best is not None else ""
        cause = f": {t.cause}" if t.cause else ""
        self._say(f"trial {t.name} {t.state} (exit {t.exit_code}){took}{best}{cause}")

    def refresh(self, running: list[Running]) -> None:
        pass

    def close(self) -> None:
        pass


class TableView(LineView):
    """The live table: trial, values, slot, state, step of total, latest and best metric; the sweep's time left."""

    def __init__(self, record: SweepRecord, note: str | None = None):
        from rich.live import Live

        super().__init__(record, note)
        self.tails: dict[int, _ValTail] = {}
        self.running: list[Running] = []
        self.live = Live(console=self.console, auto_refresh=False, transient=False)
        self.live.start()
        self._next = 0.0

    def started(self, run: Running) -> None:
        self.tails[run.trial.index] = _ValTail(run.trial.run_dir, self.record.metric or "loss")
        self.refresh([*self.running, run], force=True)

    def ended(self, run: Running) -> None:
        self.refresh([r for r in self.running if r is not run], force=True)

    def refresh(self, running: list[Running], force: bool = False) -> None:
        self.running = list(running)
        now = time.monotonic()
        if not force and now < self._next:
            return
        self._next = now + REDRAW_S
        self.live.update(self._table(), refresh=True)

    def close(self) -> None:
        self.live.update(self._table(), refresh=True)
        self.live.stop()

    def _table(self):
        from rich.table import Table
        from rich.text import Text

        metric = self.record.metric or "loss"
        table = Table(title=f"sweep {self.record.name}", caption=self._caption(), title_justify="left")
        for column in ("trial", "values", "slot", "state", "step", f"latest {metric}", f"best {metric}"):
            table.add_column(column, overflow="fold")
        by_index = {r.trial.index: r for r in self.running}
        for t in self.record.trials:
            run = by_index.get(t.index)
            tail = self.tails.get(t.index)
            latest = tail.latest() if tail and run else None
            best = t.best if run is None else tail.best(self.record.mode) if tail else None
            state = Text(t.state, style=_STYLE.get(t.state, "")) + (f" ({t.cause})" if t.cause else "")
            cells = (t.name, t.describe(), t.slot or "-", state, _steps(run), value(latest), value(best))
            table.add_row(*(c if isinstance(c, Text) else Text(c) for c in cells))  # values are no markup: [64]
        return table

    def _caption(self) -> str:
        counts = ", ".join(f"{n} {state}" for state, n in self.record.counts().items())
        left = _time_left(self.record, self.running)
        return counts + (f"; about {_duration(left)} left" if left is not None else "")


def _steps(run: Running | None) -> str:
    if run is None:
        return "-"
    done, total = _done_of_total(run.poll_progress())
    if done is None:
        return "starting"
    return f"{done}/{total}" if total else str(done)


def _done_of_total(progress: dict[str, Any]) -> tuple[int | None, int | None]:
    """(steps done, steps in all) from rank 0's progress file: its epoch, the steps per epoch, the steps done in this
    epoch and the epochs in all."""
    epoch, per_epoch, done, epochs = (progress.get(k) for k in ("epoch", "steps", "done", "total_epochs"))
    if not all(isinstance(v, int) for v in (epoch, per_epoch, done)):
        return None, None
    return (epoch - 1) * per_epoch + done, per_epoch * epochs if isinstance(epochs, int) else None


def _fraction(run: Running) -> float | None:
    done, total = _done_of_total(run.progress)
    return min(1.0, done / total) if done is not None and total else None


def _time_left(record: SweepRecord, running: list[Running]) -> float | None:
    """The sweep's time left: each running trial's (from its pace so far) and each queued one's (the finished trials'
    mean), shared out over the slots in use."""
    finished = [t.seconds for t in record.trials if t.state == FINISHED and t.seconds]
    queued = sum(1 for t in record.trials if t.state == "queued")
    mean = sum(finished) / len(finished) if finished else None
    left = []
    now = time.time()
    for run in running:
        fraction = _fraction(run)
        if not fraction or run.trial.started is None:
            return None
        spent = now - run.trial.started
        left.append(spent / fraction - spent)
        mean = mean or spent / fraction
    if queued and mean is None:
        return None
    slots = max(1, len(running))
    return (sum(left) + queued * (mean or 0.0)) / slots


class _ValTail:
    """A running trial's validation records, read as its metrics file grows."""

    def __init__(self, run_dir: str, metric: str):
        self.path, self.metric, self.offset = os.path.join(run_dir, METRICS), metric, 0
        self.values: list[float] = []

    def _read(self) -> None:
        try:
            with open(self.path, "rb") as fh:
                fh.seek(self.offset)
                for line in iter(fh.readline, b""):
                    if not line.endswith(b"\n"):
                        break  # a line still being written: read again next time
                    self.offset += len(line)
                    self._take(line)
        except OSError:
            pass

    def _take(self, line: bytes) -> None:
        try:
            rec: Any = json.loads(line)
        except ValueError:
            return
        if isinstance(rec, dict) and rec.get("split") == "val" and isinstance(rec.get(self.metric), int | float):
            self.values.append(float(rec[self.metric]))

    def latest(self) -> float | None:
        self._read()
        return self.values[-1] if self.values else None

    def best(self, mode: str) -> float | None:
        self._read()
        return (min if mode == "min" else max)(self.values) if self.values else None


def _duration(seconds: float) -> str:
    seconds = max(0.0, seconds)
    if seconds < 90:
        return f"{seconds:.0f} s"
    if seconds < 5400:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"


def view_for(record: SweepRecord, note: str | None) -> LineView:
    """The table on a terminal, lines otherwise."""
    return TableView(record, note) if err_console().is_terminal else LineView(record, note)
