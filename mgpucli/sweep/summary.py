"""What each trial came to, and the sweep's end: the trials sorted by their best validation metric, the best one
named with the command that reruns it alone (stdlib only)."""

from __future__ import annotations

import math
import os
from dataclasses import dataclass

from mgpucli.errors import EXIT_USAGE
from mgpucli.run_layout import POSTMORTEM_JSON, SWEEP_LOGS
from mgpucli.run_records.json_files import read_json_object
from mgpucli.sweep.record import FAILED, SweepRecord, TrialRecord


def record_outcome(trial: TrialRecord, metric: str, mode: str) -> None:
    """Set the trial's best value of ``metric`` (its run's validation records) and, when it failed, its one-line
    cause: the post-mortem's verdict, or the refusal its launcher printed."""
    from pathlib import Path

    from mgpucli.postmortem.run_summary import best_of, curve

    best = best_of(curve(Path(trial.run_dir), metric), mode)
    trial.best, trial.best_step = (best[1], best[0]) if best else (None, None)
    trial.cause = _cause(trial) if trial.state == FAILED else None


def _cause(trial: TrialRecord) -> str | None:
    report = read_json_object(os.path.join(trial.run_dir, POSTMORTEM_JSON))
    if report and isinstance(report.get("verdict"), str):
        failure = report.get("first_failure") or {}
        return failure.get("title") or report["verdict"]
    if trial.exit_code == EXIT_USAGE:  # refused before any worker started: the launcher's own words
        return _last_error(os.path.join(os.path.dirname(trial.run_dir), SWEEP_LOGS, f"{trial.name}.log"))
    return None


def _last_error(log: str) -> str | None:
    try:
        with open(log, encoding="utf-8", errors="replace") as fh:
            lines = fh.read().splitlines()
    except OSError:
        return None
    said = [line.removeprefix("error:").strip() for line in lines if line.startswith("error:")]
    return said[-1] if said else None


@dataclass(frozen=True)
class Ranked:
    """The trials in the order the summary shows them: best first, those without the metric last."""

    trials: list[TrialRecord]
    best: TrialRecord | None


def ranked(record: SweepRecord) -> Ranked:
    scored = [t for t in record.trials if t.best is not None and math.isfinite(t.best)]
    scored.sort(key=lambda t: (t.best if record.mode == "min" else -t.best, t.index))
    rest = sorted((t for t in record.trials if t not in scored), key=lambda t: t.index)
    return Ranked(scored + rest, scored[0] if scored else None)


def value(number: float | None) -> str:
    return "-" if number is None else f"{number:.4g}"
