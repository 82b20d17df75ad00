"""Early stopping (``trainer.early_stopping``): end the run when a validation metric stops improving.

It decides on validation metrics, which exact validation gives every rank identically (engine/evaluate.py), so
every rank reaches the same verdict after the same validation with no communication of its own: no rank breaks
out of the loop alone and leaves the others waiting in a collective. Its state (the best value, where it was
reached, validations since) is in every checkpoint, so a resumed run decides as the uninterrupted one would, and
a run that had already stopped stops again at once.
"""

from __future__ import annotations

import math
from typing import Any

from mgpucli.errors import UsageError
from mgpucli.metric_mode import resolve_mode


def metric_names(task) -> list[str]:
    """The validation metrics ``task`` reports (the names of its ``metrics`` on sums of ones)."""
    try:
        return list(task.metrics([1.0] * len(task.stat_names)))
    except Exception:  # a custom task that can't compute on made-up sums: trust the name given
        return []


class EarlyStopping:
    """Counts validations without improvement of ``metric``; ``should_stop`` after ``patience`` in a row (or at
    once when the metric is not finite)."""

    def __init__(self, metric: str, mode: str = "auto", patience: int = 3, min_delta: float = 0.0):
        self.metric, self.mode = metric, resolve_mode(metric, mode)
        self.patience, self.min_delta = int(patience), float(min_delta)
        self.best: float | None = None
        self.best_step: int | None = None
        self.wait = 0  # validations in a row without improvement
        self.nonfinite = False
        self.last_step: int | None = None  # the step of the last validation counted

    def check_metric(self, task) -> None:
        """Exit 2 before training when the task does not report the metric (built-in tasks are checked with the
        recipe already; this catches custom ones)."""
        names = metric_names(task)
        if names and self.metric not in names:
            import difflib

            close = difflib.get_close_matches(self.metric, names, n=1, cutoff=0.5)
            mean = f"; did you mean '{close[0]}'?" if close else ""
            raise UsageError(f"trainer.early_stopping.metric: {self.metric!r} is not a validation metric (the task "
                             f"reports {', '.join(names)}{mean}).",
                             f"Set trainer.early_stopping.metric to one of: {', '.join(names)}.")

    def observe(self, val: dict[str, Any], step: int) -> bool:
        """Take a validation's metrics (after step ``step``); True when the run should stop now. A second
        validation of the same step (a run resumed from where ``max_steps`` ended it validates again) counts once."""
        if step == self.last_step:
            return self.should_stop
        self.last_step = step
        value = float(val[self.metric])
        if not math.isfinite(value):
            self.nonfinite = True
        elif self.best is None or (value < self.best - self.min_delta if self.mode == "min"
                                   else value > self.best + self.min_delta):
            self.best, self.best_step, self.wait = value, step, 0
        else:
            self.wait += 1
        return self.should_stop

    @property
    def should_stop(self) -> bool:
        return self.nonfinite or self.wait >= self.patience

    def reason(self) -> str:
        if self.nonfinite:
            return f"early stopping: val {self.metric} is not finite"
        by = f" by more than {self.min_delta:g}" if self.min_delta else ""
        return (f"early stopping: val {self.metric} has not improved{by} for {self.wait} validation(s) in a row "
                f"(patience {self.patience}); best {self.best:.6g} at step {self.best_step}")

    def record(self, step: int, epoch: int, time: float) -> dict[str, Any]:
        """The run's closing record in metrics.jsonl: why it stopped."""
        return {"split": "stop", "step": step, "epoch": epoch, "reason": "early_stopping", "metric": self.metric,
                "mode": self.mode, "best": self.best, "best_step": self.best_step, "patience": self.patience,
                "message": self.reason(), "time": time}

    def state_dict(self) -> dict[str, Any]:
        return {"metric": self.metric, "mode": self.mode, "best": self.best, "best_step": self.best_step,
                "wait": self.wait, "nonfinite": self.nonfinite, "last_step": self.last_step}

    def load_state_dict(self, state: dict[str, Any]) -> bool:
        """Go on from a checkpoint's state; False (and a fresh start) when it watched another metric or mode."""
        if (state.get("metric"), state.get("mode")) != (self.metric, self.mode):
            return False
        self.best, self.best_step = state.get("best"), state.get("best_step")
        self.wait, self.nonfinite = int(state.get("wait", 0)), bool(state.get("nonfinite", False))
        self.last_step = state.get("last_step")
        return True
