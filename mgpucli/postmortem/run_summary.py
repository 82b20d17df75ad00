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
- :func:`list_runs` ``(root, sort=None) -> list[RunSummary]``: ``mgpu runs``' list, sorted, its bad input refused
  (:class:`~mgpucli.errors.UsageError`, exit 2); :func:`plot_split`: the records a ``--plot METRIC`` draws.
"""

from __future__ import annotations

import datetime
import math
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from mgpucli.errors import MgpuError, UsageError
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
    seconds: float | None  # wall time: the latest launch's (launch.json: its seconds, else started to finished),
    #                        else first to last record's time in metrics.jsonl
    cause: str | None  # a run that did not finish: the post-mortem's first failure, in one line
    val_metrics: list[str] = field(default_factory=list)  # the metrics its validation records hold
    train_metrics: list[str] = field(default_factory=list)  # and its training records

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
    if not _number(value) or not math.isfinite(value):
        return None
    return float(value)


def metric_names(records: list[dict[str, Any]], split: str = VAL) -> list[str]:
    """The metrics the ``split`` records hold (numbers, not their step, epoch, time or sample count), sorted."""
    return sorted({key for r in records if r.get("split") == split for key, value in r.items()
                   if key not in NOT_METRICS and _number(value)})


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
        val_metrics=val_names, train_metrics=metric_names(records, TRAIN))
    if records_in(str(path)):
        _from_the_post_mortem(summary, path, records)
    else:
        _from_the_records(summary, path, records, trainer)
    summary.seconds = _seconds(records) if summary.seconds is None else summary.seconds
    return summary


def _name(path: Path, root: Path | None) -> str:
    if root is None or Path(root).absolute() == path.absolute():
        return path.name or str(path)
    return os.path.relpath(path.absolute(), Path(root).absolute())


def _last(records: list[dict[str, Any]], key: str) -> int | None:
    values = [r[key] for r in records if _number(r.get(key)) and isinstance(r[key], int)]
    return max(values) if values else None


def _from_the_post_mortem(summary: RunSummary, path: Path, records: list[dict[str, Any]]) -> None:
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
    summary.seconds = _launch_seconds(report, records)


def _launch_seconds(report: Report, records: list[dict[str, Any]]) -> float | None:
    """The latest launch's wall time as its record says: its ``seconds``, else from ``started`` to ``finished`` (to
    the last record while it runs); None: the record says neither."""
    launch = (read_json_object(report.launch_json) if report.launch_json else None) or {}
    result = launch.get("result") or {}
    if _number(result.get("seconds")):
        return float(result["seconds"])
    started, finished = _iso(launch.get("started")), _iso(result.get("finished"))
    last = max((float(r["time"]) for r in records if _number(r.get("time"))), default=None)
    end = finished if finished is not None else last
    return max(0.0, end - started) if started is not None and end is not None else None


def _number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _iso(stamp: Any) -> float | None:
    """A launch record's time (``2026-12-06T19:48:43+0000``) in seconds since the epoch; None: not one."""
    try:
        return datetime.datetime.strptime(stamp, "%Y-%m-%dT%H:%M:%S%z").timestamp()
    except (TypeError, ValueError):
        return None


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


def _seconds(records: list[dict[str, Any]]) -> float | None:
    """First to last record's time in metrics.jsonl (None: fewer than two timed records)."""
    times = [float(r["time"]) for r in records if _number(r.get("time"))]
    return max(times) - min(times) if len(times) > 1 else None



# ------------------------------------------------------------------------------------------ the list
SORT_KEYS = ("name", "step", "time")  # besides a validation metric's name
_EXAMPLE = "mgpu runs runs (the folder a recipe's run_dir puts its runs in: runs/NAME by default)"


def list_runs(root: Path, sort: str | None = None) -> list[RunSummary]:
    """Every run under ``root``, summarized (with ``sort`` a validation metric: its best) and sorted: by name;
    ``step`` most first; ``time`` shortest first; a metric best first (min or max by its mode), runs without it
    last. UsageError (exit 2): ``root`` is no directory, holds no run, or no run has the metric."""
    root = Path(root)
    if not root.is_dir():
        what = "is a file, not a directory" if root.exists() else "no such directory"
        raise UsageError(f"{root}: {what}.", f"Give the folder the runs are in, e.g. {_EXAMPLE}.")
    found = find_runs(root)
    if not found:
        raise UsageError(f"no run under {root}: no folder there holds a launch record, {METRICS} or checkpoints.",
                         f"Give the folder mgpu launch or mgpu train wrote the runs to, e.g. {_EXAMPLE}.")
    metric = sort if sort is not None and sort not in SORT_KEYS else None
    summaries = [summarize(path, metric=metric, root=root) for path in found]
    if metric is not None and not any(metric in s.val_metrics for s in summaries):
        raise _unknown_metric("--sort", metric, root, summaries, also=", or sort by step, time or name")
    return sorted(summaries, key=_sort_key(sort))


def _sort_key(sort: str | None):
    if sort in (None, "name"):
        return lambda s: s.name
    if sort == "step":
        return lambda s: (s.step is None, -(s.step or 0), s.name)
    if sort == "time":
        return lambda s: (s.seconds is None, s.seconds or 0.0, s.name)
    return lambda s: (s.best is None, 0.0 if s.best is None else s.best if s.mode == "min" else -s.best, s.name)


def plot_split(summaries: list[RunSummary], metric: str, root: Path) -> str:
    """The records ``--plot metric`` draws: ``val`` where a run validates it, else ``train`` where a run logs it in
    training (lr, samples_per_s); UsageError (exit 2) when none has it."""
    if any(metric in s.val_metrics for s in summaries):
        return VAL
    if any(metric in s.train_metrics for s in summaries):
        return TRAIN
    raise _unknown_metric("--plot", metric, root, summaries, train=True)


def _unknown_metric(option: str, metric: str, root: Path, summaries: list[RunSummary], also: str = "",
                    train: bool = False) -> UsageError:
    val = sorted({m for s in summaries for m in s.val_metrics})
    have = f"validation: {', '.join(val) or 'none'}"
    if train:
        have += f"; training: {', '.join(sorted({m for s in summaries for m in s.train_metrics})) or 'none'}"
    what = "validation metric" if not train else "metric"
    return UsageError(f"{option} {metric}: no run under {root} records a {what} named {metric!r}.",
                      f"Name one the runs record ({have}){also}.")
