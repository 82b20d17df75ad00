"""``mgpu launch`` on a terminal: rank 0's output as it is written, under a live progress bar (as ``mgpu train``).

Every worker's output goes to its log files (torch's ``--redirects``). Without a terminal, torch's own ``--tee``
copies local rank 0's lines to the launcher's output with a ``[rank0]:`` prefix. On a terminal the launcher does it
itself: a thread follows local rank 0's ``stdout.log`` and ``stderr.log`` of the latest attempt (from the launch
record, so a restart is followed too), prints their lines, and draws a bar from the progress file rank 0 keeps
(:mod:`mgpucli.launch.progress_file`; a user's script keeps none: lines only). ``--show-rank N`` follows local rank
N instead; ``--show-rank all`` every rank, each line prefixed ``[rankN]:`` as torch's tee would.
"""

from __future__ import annotations

import os
import threading
from typing import TYPE_CHECKING

from mgpucli.launch import progress_file

if TYPE_CHECKING:
    from mgpucli.run_records.launch_record import LaunchRecord

POLL_S = 0.1


class _Follow:
    """New complete lines of one file, from where the last read stopped."""

    def __init__(self, path: str):
        self.path, self.offset, self.partial = path, 0, b""

    def lines(self, final: bool = False) -> list[str]:
        try:
            with open(self.path, "rb") as fh:
                fh.seek(self.offset)
                data = fh.read()
        except OSError:
            return []
        self.offset += len(data)
        data = self.partial + data
        *complete, self.partial = data.split(b"\n")
        if final and self.partial:
            complete.append(self.partial)
            self.partial = b""
        return [line.decode("utf-8", errors="replace").rstrip("\r") for line in complete]


class LiveView(threading.Thread):
    """Shows local rank 0 (or ``show``: a local rank, or "all") of ``record``'s latest attempt on ``console`` until
    :meth:`finish`; a bar from ``progress_path`` (None: no bar)."""

    def __init__(self, record: LaunchRecord, progress_path: str | None, console=None, show: str | None = None):
        super().__init__(name="mgpu-live-view", daemon=True)
        from mgpucli.console import err_console

        self.record, self.progress_path = record, progress_path
        self.show_all = show == "all"
        self.local_rank = 0 if show is None or self.show_all else int(show)
        self.console = console or err_console()
        self._finished = threading.Event()
        self._attempt: int | None = None
        self._files: list[tuple[str, _Follow]] = []  # (the prefix of its lines, the file)
        self._bar = None
        self._task = None
        self._seen: float | None = None

    def run(self) -> None:
        try:
            while not self._finished.wait(POLL_S):
                self._tick()
        finally:
            self._tick(final=True)
            if self._bar is not None:
                self._bar.stop()

    def finish(self) -> None:
        self._finished.set()
        self.join(timeout=5)

    def _tick(self, final: bool = False) -> None:
        self._follow_latest_attempt()
        self._show(final)
        if not final:
            self._update_bar()

    def _show(self, final: bool) -> None:
        for prefix, follow in self._files:
            for line in follow.lines(final):
                self.console.print(prefix + line, markup=False, highlight=False)

    def _follow_latest_attempt(self) -> None:
        latest = self.record.attempts[-1] if self.record.attempts else None
        if latest is None or latest.attempt == self._attempt:
            return
        self._show(final=True)  # the end of the previous attempt first
        self._attempt = latest.attempt
        shown = [f for _, f in sorted(latest.ranks.items()) if self.show_all or f.local_rank == self.local_rank]
        self._files = [(f"[rank{f.rank}]:" if self.show_all else "", _Follow(path))
                       for f in shown for path in (f.stdout, f.stderr) if path]

    def _update_bar(self) -> None:
        if self.progress_path is None:
            return
        try:
            stamp = os.stat(self.progress_path).st_mtime
        except OSError:
            return
        if stamp == self._seen:
            return
        self._seen = stamp
        state = progress_file.read(self.progress_path)
        if not state or state.get("steps") is None:
            return
        total = state.get("total_epochs")
        loss, speed = state.get("loss"), state.get("samples_per_s")
        fields = {"epoch": f"{state.get('epoch')}/{total}" if total else str(state.get("epoch")),
                  "loss": f"{loss:.4f}" if isinstance(loss, (int, float)) else "-",
                  "speed": f"{speed:.0f}" if isinstance(speed, (int, float)) else "-"}
        done = min(state.get("done") or 0, state["steps"])
        if self._bar is None:
            from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

            self._bar = Progress(
                TextColumn("epoch {task.fields[epoch]}"), BarColumn(), MofNCompleteColumn(),
                TextColumn("loss {task.fields[loss]}"), TextColumn("{task.fields[speed]} samples/s"),
                TimeRemainingColumn(), console=self.console, refresh_per_second=4, transient=True,
            )
            self._task = self._bar.add_task("train", total=state["steps"], completed=done, **fields)
            self._bar.start()
        else:
            self._bar.update(self._task, total=state["steps"], completed=done, **fields)
