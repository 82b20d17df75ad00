"""A profiler window (``trainer.profile``): a ``torch.profiler`` trace of a few optimizer steps on every rank.

The profiler runs only for the steps asked for (``start_step`` .. ``start_step + steps - 1``, numbered as in
metrics.jsonl), so the rest of the run pays nothing. Each step is marked ``ProfilerStep#N``, the name
TensorBoard's profiler plugin and Perfetto group steps by. CPU activity always, CUDA activity on GPUs. At the
window's end (or when the run ends or stops inside it) each rank writes its Chrome trace to
``RUN_DIR/profile/rank{N}.json`` (written beside, then renamed: never half a file) and training goes on.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

PROFILE_DIR = "profile"


class ProfileWindow:
    """One rank's window. ``before_step``/``after_step`` bracket every step; both are a comparison outside it."""

    def __init__(self, start_step: int, steps: int, run_dir: Path, rank: int, device: torch.device,
                 written: Callable[[Path], None] | None = None):
        self.first, self.last = int(start_step), int(start_step) + int(steps) - 1
        self.path = Path(run_dir) / PROFILE_DIR / f"rank{rank}.json"
        self.device = device
        self._on_written = written  # told the file once it is complete
        self.written: Path | None = None
        self._profiler: Any = None
        self._mark: Any = None

    def activities(self) -> list:
        found = [torch.profiler.ProfilerActivity.CPU]
        if self.device.type == "cuda" and torch.cuda.is_available():
            found.append(torch.profiler.ProfilerActivity.CUDA)
        return found

    def before_step(self, step: int) -> None:
        """Step ``step`` (its first batch in hand) is about to run."""
        if not self.first <= step <= self.last or self.written is not None:
            return
        if self._profiler is None:  # the window opens (a run resumed inside it opens it where it resumed)
            self._profiler = torch.profiler.profile(activities=self.activities())
            self._profiler.start()
        self._mark = torch.profiler.record_function(f"ProfilerStep#{step}")
        self._mark.__enter__()

    def after_step(self, step: int) -> None:
        if self._mark is not None:
            self._mark.__exit__(None, None, None)
            self._mark = None
        if self._profiler is not None and step >= self.last:
            self.close()

    def close(self) -> Path | None:
        """Stop and write the trace if the window is open (the run ended or stopped inside it); the file written."""
        if self._profiler is None:
            return self.written
        if self._mark is not None:  # a step that raised: its mark still ends the trace cleanly
            self._mark.__exit__(None, None, None)
            self._mark = None
        profiler, self._profiler = self._profiler, None
        profiler.stop()
        self.path.parent.mkdir(parents=True, exist_ok=True)
        partial = self.path.with_name(f".{self.path.name}.tmp-{os.getpid()}")
        profiler.export_chrome_trace(str(partial))
        os.replace(partial, self.path)
        self.written = self.path
        if self._on_written is not None:
            self._on_written(self.path)
        return self.written


def window_for(asked: Any, total_steps: int, run_dir: Path, runtime: Any, reporter: Any) -> ProfileWindow | None:
    """``trainer.profile``'s window on this rank (None when not asked for); a window after the run's last step is
    said at once."""
    if asked is None:
        return None
    if asked.start_step > total_steps:
        reporter.warn(f"trainer.profile.start_step={asked.start_step} is after the run's last step ({total_steps}): "
                      "nothing will be profiled.")
    last = asked.start_step + asked.steps - 1
    return ProfileWindow(asked.start_step, asked.steps, run_dir, runtime.rank, runtime.device,
                         written=lambda path: reporter.message(
                             f"profiler: steps {asked.start_step}-{last} traced into {path.parent}/rank*.json (open "
                             "in ui.perfetto.dev or chrome://tracing)"))
