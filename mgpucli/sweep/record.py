"""``runs/NAME/sweep.json``: the sweep as it stands (stdlib only), and what running the same command again does.

The record is rewritten whole (atomically) whenever a trial starts or ends. It holds the recipe, the overrides every
trial gets, the axes, the metric trials are compared by, and per trial: its values, run dir, state, exit code, slot,
times and best metric.

The same command again continues the sweep: a finished trial is kept; a stopped one (exit 75: a complete checkpoint),
one that failed, and one the sweep was running when it ended otherwise are launched again with ``--resume auto``
(from their last checkpoint; a run dir without one starts afresh); one never started is started.
"""

from __future__ import annotations

import os
import signal
import time
from dataclasses import asdict, dataclass, field
from typing import Any

from mgpucli.errors import EXIT_OK, EXIT_PREEMPTED, UsageError
from mgpucli.run_layout import SWEEP_JSON
from mgpucli.run_records.json_files import read_json_object, write_json
from mgpucli.sweep.grid import Grid, Trial

QUEUED, RUNNING, FINISHED, FAILED, STOPPED = "queued", "running", "finished", "failed", "stopped"
PRUNED = "pruned"  # a search stopped it at a checkpoint, its validation fallen behind the others': not run again
STATES = (QUEUED, RUNNING, FINISHED, FAILED, STOPPED, PRUNED)
VERSION = 1


@dataclass
class TrialRecord:
    """One trial as ``sweep.json`` holds it."""

    index: int
    name: str
    values: dict[str, str]  # key -> value, as the overrides write them
    run_dir: str
    state: str = QUEUED
    exit_code: int | None = None
    slot: str | None = None
    started: float | None = None  # time.time() of its latest start
    ended: float | None = None
    seconds: float = 0.0  # its launches' wall time, all of them together
    launches: int = 0
    best: float | None = None  # its best validation value of the sweep's metric
    best_step: int | None = None
    cause: str | None = None  # a failed trial's one-line cause (its post-mortem's verdict)
    search_trial: int | None = None  # a search's trial number in its study (Optuna's), told the trial's result

    @property
    def overrides(self) -> list[str]:
        return [f"{key}={value}" for key, value in self.values.items()]

    def describe(self) -> str:
        return " ".join(self.overrides)

    def end(self, code: int, now: float, signalled: bool = False) -> None:
        """The trial's launch ended with ``code``: finished (0), stopped (75: a complete checkpoint), else failed;
        ``signalled``: the sweep had passed a stop signal on to it, so an end by that signal (a launcher stopped
        before its workers started: 130, 143, or killed by it) is a stop too."""
        self.exit_code, self.ended = code, now
        self.seconds += now - (self.started or now)
        by_signal = code < 0 or code in (128 + signal.SIGINT, 128 + signal.SIGTERM)
        stopped = code == EXIT_PREEMPTED or (signalled and by_signal)
        self.state = FINISHED if code == EXIT_OK else STOPPED if stopped else FAILED


@dataclass
class SweepRecord:
    """The whole sweep: what it runs and every trial's state."""

    name: str
    recipe: str
    common: list[str]
    axes: list[dict[str, Any]]  # {"key": ..., "values": [...]}
    metric: str | None
    mode: str  # "min" or "max"
    trials: list[TrialRecord]
    created: float = field(default_factory=time.time)
    version: int = VERSION
    search: str = "grid"  # or "optuna": the trials are asked of its sampler as slots free
    budget: int | None = None  # a search's trials in all (--trials)

    def to_json(self) -> dict[str, Any]:
        return {**asdict(self), "trials": [asdict(t) for t in self.trials]}

    def save(self, sweep_dir: str) -> None:
        write_json(os.path.join(sweep_dir, SWEEP_JSON), self.to_json(), indent=1)

    def counts(self) -> dict[str, int]:
        states = [t.state for t in self.trials]
        return {s: states.count(s) for s in STATES if s in states}


def new(name: str, recipe: str, grid: Grid, sweep_dir: str, metric: str | None, mode: str) -> SweepRecord:
    trials = [_trial_record(t, sweep_dir) for t in grid.trials]
    return SweepRecord(name, recipe, list(grid.common), grid_axes(grid), metric, mode, trials)


def grid_axes(grid: Grid) -> list[dict[str, Any]]:
    return [{"key": a.key, "values": list(a.values)} for a in grid.axes]


def _trial_record(trial: Trial, sweep_dir: str) -> TrialRecord:
    return TrialRecord(trial.index, trial.name, dict(trial.values), os.path.join(sweep_dir, trial.name))


def load(sweep_dir: str) -> SweepRecord | None:
    """The sweep ``sweep_dir`` holds; None when it holds none. A record this version cannot read is refused."""
    path = os.path.join(sweep_dir, SWEEP_JSON)
    data = read_json_object(path)
    if data is None:
        if os.path.exists(path):
            raise UsageError(f"{path} cannot be read (not a complete JSON record).",
                             "Give the sweep another --name, or move that directory away.")
        return None
    try:
        trials = [TrialRecord(**t) for t in data["trials"]]
        fields = {k: data[k] for k in ("name", "recipe", "common", "axes", "metric", "mode", "created", "version")}
        fields |= {k: data[k] for k in ("search", "budget") if k in data}
    except (KeyError, TypeError) as err:
        raise UsageError(f"{path} is not a sweep record mgpu {VERSION} can read ({err}).",
                         "Give the sweep another --name.") from None
    return SweepRecord(**fields, trials=trials)


def check_same(recorded: SweepRecord, recipe: str, common: list[str], axes: list[dict[str, Any]], sweep_dir: str,
               search: str = "grid") -> None:
    """The command given continues the recorded sweep only if it runs the same trials (a search: the same space):
    UsageError otherwise."""
    now = {"recipe": recipe, "overrides": list(common), "axes": axes, "search": search}
    then = {"recipe": recorded.recipe, "overrides": recorded.common, "axes": recorded.axes, "search": recorded.search}
    differs = [k for k in now if now[k] != then[k]]
    if differs:
        said = "; ".join(f"{k}: {_said(then[k])} then, {_said(now[k])} now" for k in differs)
        raise UsageError(f"{sweep_dir} holds another sweep ({said}).",
                         "Continue it with the command that started it, or give this one another --name.")


def _said(value: Any) -> str:
    if isinstance(value, list) and value and isinstance(value[0], dict):
        return " ".join(f"{a['key']}={','.join(a['values'])}" for a in value)
    return " ".join(value) if isinstance(value, list) else str(value)


def to_run(record: SweepRecord) -> list[TrialRecord]:
    """The trials the sweep runs (in order): every one neither finished nor pruned."""
    return [t for t in record.trials if t.state not in (FINISHED, PRUNED)]
