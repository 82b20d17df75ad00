"""Rank 0's progress, handed to ``mgpu launch`` through a small JSON file (stdlib only: the worker side never imports
rich).

On a terminal, ``mgpu launch`` shows rank 0's output with a live progress bar, as ``mgpu train`` does. The worker's
output goes to log files (torch's ``--redirects``), which carry lines but not a bar; so rank 0 also writes where it
is (epoch, steps done, the last loss and speed) to the file named in ``MGPU_PROGRESS_FILE``, at most a few times a
second, and the launcher draws the bar from it (:mod:`mgpucli.launch.live_view`).
"""

from __future__ import annotations

import contextlib
import time
from typing import Any

from mgpucli.run_records.json_files import read_json_object, write_json

ENV = "MGPU_PROGRESS_FILE"
EVERY_S = 0.25  # the most often the file is rewritten


def write(path: str, state: dict[str, Any]) -> None:
    """Replace the file atomically (a reader never sees half of it); a failure to write is not the run's problem."""
    with contextlib.suppress(OSError):
        write_json(path, state)


def read(path: str) -> dict[str, Any] | None:
    return read_json_object(path)


class ProgressFileReporter:
    """A Reporter (mgpucli.engine.reporter) that passes everything to ``inner`` and keeps the progress file."""

    def __init__(self, inner: Any, path: str):
        self.inner, self.path = inner, path
        self.state: dict[str, Any] = {"epoch": None, "total_epochs": None, "steps": None, "done": 0,
                                      "loss": None, "samples_per_s": None}
        self._next = 0.0

    def _write(self, force: bool = False) -> None:
        now = time.monotonic()
        if force or now >= self._next:
            self._next = now + EVERY_S
            write(self.path, self.state)

    def start(self, info: dict[str, Any]) -> None:
        self.state["total_epochs"] = info.get("total_epochs")
        self.inner.start(info)

    def epoch_start(self, epoch: int, steps: int, done: int) -> None:
        self.state.update(epoch=epoch, steps=steps, done=done)
        self._write(force=True)
        self.inner.epoch_start(epoch, steps, done)

    def step(self, step: int) -> None:  # every optimizer step: a counter and a clock read, a write a few times a second
        self.state["done"] += 1
        self._write()
        self.inner.step(step)

    def log(self, record: dict[str, Any]) -> None:
        if record.get("split") == "train":
            self.state.update(loss=record.get("loss"), samples_per_s=record.get("samples_per_s"))
        self.inner.log(record)

    def epoch_end(self, epoch: int, train: dict[str, Any] | None, val: dict[str, Any] | None) -> None:
        self._write(force=True)
        self.inner.epoch_end(epoch, train, val)

    def message(self, text: str) -> None:
        self.inner.message(text)

    def warn(self, text: str) -> None:
        self.inner.warn(text)

    def close(self) -> None:
        self._write(force=True)
        self.inner.close()
