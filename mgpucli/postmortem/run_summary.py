"""One line per run: how it ended, how far it got, its best validation metric, its wall time (stdlib only).

``mgpu runs [DIR]`` lists every run under DIR with it, and ``mgpu sweep`` summarizes its trials with it; neither
imports torch. The API, kept stable for both:

- :func:`find_runs` ``(root) -> list[Path]``: every run dir under ``root`` (``root`` itself included), sorted. A run
  dir holds a launch record (any node's), ``metrics.jsonl`` or checkpoints (:func:`mgpucli.run_files.holds_a_run`);
  its own folders are not searched. A sweep's folder (it holds ``sweep.json``) is no run: its trials are found.
- :func:`summarize` ``(run_dir, metric=None, root=None) -> RunSummary``: the run's state is the post-mortem's
  (:func:`mgpucli.postmortem.diagnose_run`, what ``mgpu doctor RUN_DIR`` says); a run without a launch record
  (``mgpu train`` alone, or torchrun) gets its state from its records and checkpoint.
- :func:`curve` ``(run_dir, metric, split="val") -> list[(step, value)]``: one point per step, the latest record's.
- :func:`read_records` and :func:`metric_names`: the records of ``metrics.jsonl`` and the metrics they hold.
"""

from __future__ import annotations

import math
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from mgpucli.errors import MgpuError
from mgpucli.metric_mode import resolve_mode
from mgpucli.postmortem.checkpoint_peek import read_checkpoint_info
from mgpucli.postmortem.diagnose import diagnose_run
from mgpucli.postmortem.reader import read_metrics, read_recipe
from mgpucli.postmortem.report import Report
from mgpucli.run_files import holds_a_run, saved_checkpoint
from mgpucli.run_layout import METRICS, RECIPE, SWEEP_JSON
from mgpucli.run_records.json_files import read_json_object
from mgpucli.run_records.node_records import records_in

VAL, TRAIN = "val", "train"
NOT_METRICS = ("split", "step", "epoch", "time", "samples")  # a record's keys that are no metric
NO_LAUNCH_RECORD = "unknown"  # the state of a run without a launch record whose records do not show it finished


@dataclass
class RunSummary:
    """One run, as ``mgpu runs`` lists it (``to_json()``: these fields, as they are)."""

    name: str  # the run dir relative to the listed root (the root's own name when the root is the run)
    run_dir: str  # absolute
    # the post-mortem's Report.status: succeeded | failed | stopped | preempted | stalled | running | launcher_gone |
    # unmet | refused | node_lost | not_started...; without a launch record: succeeded (its records show it
    # finished) or "unknown"; "unreadable": a launch record the post-mortem cannot read
    status: str
    verdict: str  # the post-mortem's one-line verdict (or what the records show, without a launch record)
    exit_code: int | None  # `mgpu doctor RUN_DIR`'s: 0 finished, 75 preempted, 1 otherwise; None: it cannot read it
    launched: bool  # the run has a launch record (mgpu launch); False: mgpu train alone, or torchrun
    step: int | None  # the last optimizer step recorded (metrics, or the checkpoint a stop saved)
    epoch: int | None  # the epoch of the last record (numbered from 1, as in metrics.jsonl)
    metric: str | None  # the validation metric `best` is of: the one asked, else the recipe's trainer.best_metric,
    #                     else loss where validation records one; None: none
    mode: str | None  # min | max: which way `metric` improves (trainer.best_mode; auto: min for loss-like names)
    best: float | None  # its best value in the run's validations
    best_step: int | None  # the step of the validation that reached it
    last_val: dict[str, Any] | None  # the latest validation record
    seconds: float | None  # wall time: the latest launch's (launch.json), else first to last record's time
    cause: str | None  # a run that did not finish: the post-mortem's first failure, in one line
    val_metrics: list[str] = field(default_factory=list)  # the metrics its validation records hold

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


# ------------------------------------------------------------------------------------------ finding runs
def find_runs(root: Path) -> list[Path]:
    """Every run dir under ``root`` (``root`` itself when it is one), sorted; symbolic links and hidden folders are
    not followed, a run dir's own folders (logs, checkpoints) not searched."""
    found, todo = [], [Path(root)]
    while todo:
        path = todo.pop()
        if not (path / SWEEP_JSON).is_file() and holds_a_run(path):
            found.append(path)
            continue
        try:
            entries = list(os.scandir(path))
        except OSError:
            continue
        todo += [Path(e.path) for e in entries if not e.name.startswith(".") and e.is_dir(follow_symlinks=False)]
    return sorted(found)


# ------------------------------------------------------------------------------------------ records
def read_records(run_dir: Path) -> list[dict[str, Any]]:
    """Every record of ``run_dir``'s ``metrics.jsonl`` (train, val, events), in order; a torn line is skipped."""
    return read_metrics(os.path.join(run_dir, METRICS), max_bytes=None)


def _value(record: dict[str, Any], metric: str) -> float | None:
    value = record.get(metric)
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        return None
    return float(value)


def metric_names(records: list[dict[str, Any]], split: str = VAL) -> list[str]:
    """The metrics the ``split`` records hold (numbers, not their step, epoch, time or sample count), sorted."""
    return sorted({key for r in records if r.get("split") == split for key, value in r.items()
                   if key not in NOT_METRICS and isinstance(value, int | float) and not isinstance(value, bool)})


def curve(run_dir: Path, metric: str, split: str = VAL, records: list[dict[str, Any]] | None = None,
          ) -> list[tuple[int, float]]:
    """(step, value) of ``metric`` in the ``split`` records, by step; where a resumed run recorded a step again,
    the latest record's value. ``records``: already read (:func:`read_records`)."""
    points: dict[int, float] = {}
    for record in read_records(run_dir) if records is None else records:
        value, step = _value(record, metric), record.get("step")
        if record.get("split") == split and value is not None and isinstance(step, int):
            points[step] = value
    return sorted(points.items())


def best_of(points: list[tuple[int, float]], mode: str) -> tuple[int, float] | None:
    """The (step, value) that is best by ``mode`` (min or max); the first one to reach it."""
    best = None
    for step, value in points:
        if best is None or (value < best[1] if mode == "min" else value > best[1]):
            best = (step, value)
    return best


# ------------------------------------------------------------------------------------------ one run
def summarize(run_dir: Path, metric: str | None = None, root: Path | None = None) -> RunSummary:
    """The summary of ``run_dir`` (named relative to ``root``); ``metric``: the validation metric whose best to
    give (default: the recipe's ``trainer.best_metric``, else ``loss``)."""
    path = Path(run_dir)
    records = read_records(path)
    recipe = read_recipe(os.path.join(path, RECIPE)) or {}
    trainer = recipe.get("trainer") if isinstance(recipe.get("trainer"), dict) else {}
    val_names = metric_names(records, VAL)
    name = metric or trainer.get("best_metric") or ("loss" if "loss" in val_names else None)
    mode = None
    if isinstance(name, str):
        asked = trainer.get("best_mode") if name == trainer.get("best_metric") else None
        mode = resolve_mode(name, asked if asked in ("min", "max") else "auto")
    best = best_of(curve(path, name, VAL, records), mode) if isinstance(name, str) and mode else None
    summary = RunSummary(
        name=_name(path, root), run_dir=str(path.absolute()), status="", verdict="", exit_code=None, launched=False,
        step=_last(records, "step"), epoch=_last(records, "epoch"), metric=name if isinstance(name, str) else None,
        mode=mode, best=best[1] if best else None, best_step=best[0] if best else None,
        last_val=next((r for r in reversed(records) if r.get("split") == VAL), None), seconds=None, cause=None,
        val_metrics=val_names)
    if records_in(str(path)):
        _from_the_post_mortem(summary, path)
    else:
        _from_the_records(summary, path, records, trainer)
    summary.seconds = _seconds(path, records) if summary.seconds is None else summary.seconds
    return summary


def _name(path: Path, root: Path | None) -> str:
    if root is None or Path(root).absolute() == path.absolute():
        return path.name or str(path)
    return os.path.relpath(path.absolute(), Path(root).absolute())


def _last(records: list[dict[str, Any]], key: str) -> int | None:
    values = [r[key] for r in records if isinstance(r.get(key), int) and not isinstance(r.get(key), bool)]
    return max(values) if values else None


def _from_the_post_mortem(summary: RunSummary, path: Path) -> None:
    """State, verdict, exit code, cause and wall time from ``mgpu doctor RUN_DIR``'s diagnosis."""
    summary.launched = True
    try:
        report: Report = diagnose_run(str(path))
    except MgpuError as err:  # a launch record that cannot be read: the doctor refuses it (exit 2)
        summary.status, summary.verdict = "unreadable", str(err).splitlines()[0]
        return
    summary.status, summary.verdict, summary.exit_code = report.status, report.verdict, report.exit_code
    if report.first_failure is not None and not report.finished:
        summary.cause = report.first_failure.match.title
    if report.preemption is not None and report.preemption.step is not None:  # the step the stop saved
        summary.step = max(summary.step or 0, report.preemption.step)
    summary.seconds = _launch_seconds(report)


def _launch_seconds(report: Report) -> float | None:
    """The latest launch's wall time as its record says (None while it runs: the records' time is used)."""
    launch = read_json_object(report.launch_json) if report.launch_json else None
    seconds = ((launch or {}).get("result") or {}).get("seconds")
    return float(seconds) if isinstance(seconds, int | float) and not isinstance(seconds, bool) else None


def _from_the_records(summary: RunSummary, path: Path, records: list[dict[str, Any]],
                      trainer: dict[str, Any]) -> None:
    """A run without a launch record (``mgpu train`` alone, torchrun): finished when its last checkpoint reached
    ``trainer.max_steps`` or the end of ``trainer.epochs``, or early stopping stopped it; else unknown."""
    saved = saved_checkpoint(path)
    info = read_checkpoint_info(str(saved)) if saved is not None else None
    if info is not None:
        summary.step = max(summary.step or 0, info.step)
    max_steps, epochs = trainer.get("max_steps"), trainer.get("epochs")
    done = info is not None and ((isinstance(max_steps, int) and info.step >= max_steps) or (
        isinstance(epochs, int) and info.epoch is not None and info.epoch >= epochs and info.mid_epoch is False))
    stopped_early = any(r.get("split") == "stop" for r in records)
    at = f" at step {summary.step}" if summary.step is not None else ""
    if done or stopped_early:
        summary.status, summary.exit_code = "succeeded", 0
        summary.verdict = f"{summary.name} finished{at} (no launch record: trained with mgpu train or torchrun)."
        return
    summary.status = NO_LAUNCH_RECORD
    summary.verdict = (f"{summary.name} trained{at or ' no step'}; no launch record says how it ended (mgpu train "
                       "alone or torchrun: mgpu launch keeps one, which mgpu doctor reads).")


def _seconds(path: Path, records: list[dict[str, Any]]) -> float | None:
    """First to last record's time in metrics.jsonl (None: fewer than two timed records)."""
    times = [float(r["time"]) for r in records if isinstance(r.get("time"), int | float)]
    return max(times) - min(times) if len(times) > 1 else None

