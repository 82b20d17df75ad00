"""``mgpu sweep --search optuna --trials N``: Optuna's sampler picks each trial's values as a slot frees, and its
pruner stops a trial whose validation falls behind the others' (optuna: the ``mgpu[sweep]`` extra).

The space is Hydra's sweep syntax, read as Hydra's own Optuna sweeper reads it: ``interval(lo,hi)`` a float,
``tag(log, interval(lo,hi))`` on a log scale, ``range(a,b[,step])`` an integer, ``a,b,c`` and ``choice(...)`` a
category. The study lives in ``runs/NAME/optuna.db`` (SQLite), so the same command again continues it: trials a stop
interrupted resume from their checkpoints and are told to the study as they end, new ones are asked until N.
A trial reports each validation of the sweep's metric to the study; a pruned one is stopped at a checkpoint by
SIGTERM and reads as pruned, not failed.
"""

from __future__ import annotations

import collections
import math
import os
from dataclasses import dataclass
from typing import Any

from mgpucli.errors import UsageError
from mgpucli.sweep.grid import Trial, labels_of, parsed, trial_name
from mgpucli.sweep.record import FAILED, FINISHED, PRUNED, SweepRecord, TrialRecord, to_run
from mgpucli.sweep.trials import Running

STUDY_DB = "optuna.db"  # in the sweep's folder
SEED = 0  # the sampler's: the same command samples the same values
REPORT_S = 1.0  # how often the running trials' new validations are read and reported


@dataclass(frozen=True)
class Param:
    """One searched key: a float or int between bounds, or a category."""

    key: str
    kind: str  # "float" | "int" | "categorical"
    low: float = 0.0
    high: float = 0.0
    step: int | None = None  # int: range's step
    log: bool = False
    choices: tuple[str, ...] = ()

    def spec(self) -> str:
        """The param as sweep.json records it (and a continued sweep must give it again)."""
        if self.kind == "categorical":
            return f"choice({','.join(self.choices)})"
        what = f"interval({self.low:g},{self.high:g})" if self.kind == "float" else \
            f"range({int(self.low)},{int(self.high) + 1},{self.step})"
        return f"tag(log, {what})" if self.log else what

    def distribution(self):
        from optuna.distributions import CategoricalDistribution, FloatDistribution, IntDistribution

        if self.kind == "categorical":
            return CategoricalDistribution(list(self.choices))
        if self.kind == "int":
            return IntDistribution(int(self.low), int(self.high), step=self.step or 1)
        return FloatDistribution(self.low, self.high, log=self.log)

    def corner(self, j: int) -> str:
        """A value the recipe check composes: the low bound (even ``j``), the high one (odd), each category in turn."""
        if self.kind == "categorical":
            return self.choices[j % len(self.choices)]
        bound = self.low if j % 2 == 0 else self.high
        return str(int(bound)) if self.kind == "int" else repr(float(bound))


@dataclass(frozen=True)
class Space:
    common: tuple[str, ...]
    params: tuple[Param, ...]

    def axes(self) -> list[dict[str, Any]]:
        return [{"key": p.key, "values": [p.spec()]} for p in self.params]

    def corners(self) -> tuple[Trial, ...]:
        """The compositions checked before anything starts: every bound and every category at least once."""
        count = max([2, *(len(p.choices) for p in self.params)])
        return tuple(Trial(j, tuple((p.key, p.corner(j)) for p in self.params), f"check-{j}") for j in range(count))


def space(overrides: list[str]) -> Space:
    """The searched keys and the overrides every trial gets; UsageError (exit 2) where nothing is searched."""
    common, params = [], []
    for line, override in parsed(overrides):
        key = override.get_key_element()
        if not override.is_sweep_override():
            common.append(line)
        elif override.is_interval_sweep():
            value = override.value()
            params.append(Param(key, "float", float(value.start), float(value.end), log="log" in value.tags))
        elif override.is_range_sweep():
            r = override.value()
            step = r.step or 1
            if not all(isinstance(x, int) for x in (r.start, r.stop, step)) or step < 1 or r.stop <= r.start:
                raise UsageError(f"{line}: a searched range is of integers, rising: range(start,stop[,step]).",
                                 f"Example: {key}=range(1,9,2), or interval(lo,hi) for a float.")
            params.append(Param(key, "int", r.start, r.stop - 1 - (r.stop - 1 - r.start) % step, step=step))
        else:
            params.append(Param(key, "categorical", choices=tuple(override.sweep_string_iterator())))
    if not params:
        raise UsageError("Nothing to search: no override gives a range of values.",
                         "Give one: 'optim.lr=tag(log, interval(1e-4,1e-1))', 'trainer.epochs=range(1,5)' or a,b,c.")
    return Space(tuple(common), tuple(params))


def study(record: SweepRecord, sweep_dir: str):
    """The sweep's Optuna study, made or loaded from ``runs/NAME/optuna.db``."""
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)  # the sweep says what happens, once
    storage = f"sqlite:///{os.path.abspath(os.path.join(sweep_dir, STUDY_DB))}"
    return optuna.create_study(study_name=record.name, storage=storage, load_if_exists=True,
                               direction="minimize" if record.mode == "min" else "maximize",
                               sampler=optuna.samplers.TPESampler(seed=SEED), pruner=optuna.pruners.MedianPruner())


def require_optuna() -> None:
    try:
        import optuna  # noqa: F401
    except ImportError:
        raise UsageError("--search optuna needs Optuna, which is not installed.",
                         "pip install 'mgpu[sweep]' (or pip install optuna).") from None


class SearchSource:
    """The trials of a search, for :func:`mgpucli.sweep.scheduler.run_trials`: first those a stop left, then new ones
    asked of the study until the sweep has ``record.budget``."""

    def __init__(self, record: SweepRecord, space_: Space, sweep_dir: str):
        self.record, self.space, self.sweep_dir = record, space_, sweep_dir
        self.study = study(record, sweep_dir)
        self.left = collections.deque(to_run(record))
        self.asked: dict[int, Any] = {}  # trial index -> its optuna Trial (asked in this process)
        self.reported: dict[int, int] = {}  # trial index -> validation records already reported
        self.next_report = 0.0  # the metrics files are read at most every REPORT_S

    def has_next(self) -> bool:
        return bool(self.left) or len(self.record.trials) < (self.record.budget or 0)

    def next(self) -> TrialRecord:
        if self.left:
            return self.left.popleft()
        asked = self.study.ask({p.key: p.distribution() for p in self.space.params})
        index = len(self.record.trials)
        values = [_said(asked.params[p.key]) for p in self.space.params]
        keys = [p.key for p in self.space.params]
        width = len(str((self.record.budget or 1) - 1))
        name = trial_name(index, width, labels_of(keys), [_short(v) for v in values])
        trial = TrialRecord(index, name, dict(zip(keys, values, strict=True)), os.path.join(self.sweep_dir, name),
                            search_trial=asked.number)
        self.record.trials.append(trial)
        self.asked[index] = asked
        return trial

    def to_prune(self, running: list[Running]) -> list[Running]:
        """Report each running trial's new validations; the ones the pruner stops (each once)."""
        import time
        from pathlib import Path

        from mgpucli.postmortem.run_summary import curve

        if time.monotonic() < self.next_report:
            return []
        self.next_report = time.monotonic() + REPORT_S
        prune = []
        for run in running:
            asked = self.asked.get(run.trial.index)
            if asked is None or run.pruned:
                continue  # a trial a stop left is told its end, not pruned
            points = curve(Path(run.trial.run_dir), self.record.metric or "loss")
            for step, value in points[self.reported.get(run.trial.index, 0):]:
                asked.report(value, step)
            self.reported[run.trial.index] = len(points)
            if points and asked.should_prune():
                prune.append(run)
        return prune

    def ended(self, run: Running) -> None:
        """Tell the study how the trial ended: its best value, pruned, or failed; a stopped one stays running."""
        from optuna.trial import TrialState

        t = run.trial
        if t.search_trial is None:
            return
        if t.state == FINISHED and t.best is not None and math.isfinite(t.best):
            self.study.tell(t.search_trial, t.best)
        elif t.state == PRUNED:
            self.study.tell(t.search_trial, state=TrialState.PRUNED)
        elif t.state in (FINISHED, FAILED):
            self.study.tell(t.search_trial, state=TrialState.FAIL)


def _said(value: Any) -> str:
    """A sampled value as an override writes it (a float in full, so that the trial runs exactly it)."""
    return repr(float(value)) if isinstance(value, float) else str(value)


def _short(value: str) -> str:
    """A value as a trial's name shows it: floats to 4 significant digits."""
    try:
        number = float(value)
    except ValueError:
        return value
    return f"{number:.4g}" if "." in value or "e" in value else value
