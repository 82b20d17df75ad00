"""Experiment trackers on rank 0 (W&B, MLflow): every train and validation record, the recipe, and the run's end.

Only global rank 0 builds a :class:`Tracking`, and only when ``trainer.loggers`` names a tracker. One background
thread makes every tracker call in order (start, log, finish) and imports the tracker there (one module per
tracker, ``<name>_sink.py``), so no other rank imports one, and a slow network or a hung server never holds up a
training step: the training loop only puts records on a queue. A tracker that raises is switched off with one
warning, a ``{"split": "event"}`` record in metrics.jsonl and a note in ``RUN_DIR/trackers.json`` (read by
``mgpu doctor RUN_DIR``); training and checkpoints go on.

Resume: each tracker's run id is in ``trackers.json`` and in every checkpoint; ``trackers.json`` also keeps the last
step of each split the tracker took (``logged``, updated after every record). A run resumed from a checkpoint
(``--resume``, and ``--max-restarts`` restarts) reattaches to the same tracker runs; first it sends each tracker the
records up to the checkpoint's step that it missed (metrics.jsonl has them: an earlier attempt stopped before its
tracker had started, or after the tracker had failed), then the new ones, skipping steps a tracker already holds
(logged after the checkpoint, before a crash). So each tracker's steps only ever go up, and none is sent twice.
"""

from __future__ import annotations

import collections
import importlib
import json
import os
import queue
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from mgpucli import faults
from mgpucli import trackers as specs
from mgpucli.engine.reporter import Reporter
from mgpucli.errors import EXIT_FAILED, EXIT_OK, EXIT_PREEMPTED
from mgpucli.run_layout import METRICS
from mgpucli.run_records import step_anatomy

SPLITS = ("train", "val")  # the records trackers get; metrics.jsonl's other records (events) are not metrics
# How long rank 0 waits for the trackers at the end. Preempted: within torch's 30 s between its SIGTERM and SIGKILL.
# Failed: the other ranks may wait for rank 0 to leave before the failure is reported.
FINISH_TIMEOUT_S = {"finished": 120.0, "failed": 10.0, "preempted": 15.0}
EXIT_CODES = {"finished": EXIT_OK, "failed": EXIT_FAILED, "preempted": EXIT_PREEMPTED}


@dataclass(frozen=True)
class Context:
    """What a tracker needs to start its run."""

    run_dir: Path
    name: str  # the recipe's name: the default W&B project and MLflow experiment
    recipe: dict[str, Any]  # resolved
    tags: dict[str, str]  # world size, device, strategy, versions
    options: dict[str, Any]  # its trainer.<name> section
    run_id: str | None  # the run to continue, or (W&B) the new run's id; None: the tracker chooses
    continuing: bool = False  # run_id is an earlier attempt's run
    environ: Mapping[str, str] = field(default_factory=lambda: dict(os.environ))


@dataclass
class Started:
    """A tracker's run: its entry in trackers.json, and what to tell the user once (``warn``: a warning)."""

    entry: dict[str, Any]
    message: str | None = None
    warn: str | None = None


class Sink(Protocol):
    title: str

    def start(self, ctx: Context) -> Started: ...
    def log(self, step: int, metrics: dict[str, float], wall_time: float) -> None: ...
    def finish(self, status: str, checkpoints: dict[str, str]) -> None: ...


def metrics_of(record: dict[str, Any]) -> dict[str, float]:
    """A metrics.jsonl record as tracker metrics: ``train/loss``, ``val/accuracy``... (its numbers but the step and
    the time; the epoch too, as Lightning logs it)."""
    split = record["split"]
    return {**{f"{split}/{key}": float(value) for key, value in record.items()
               if key not in ("split", "step", "time") and isinstance(value, (int, float))
               and not isinstance(value, bool)}, **step_anatomy.scalars(record)}


def backlog(metrics_path: Path, through: int) -> list[dict[str, Any]]:
    """The train and val records of metrics.jsonl up to step ``through`` (a checkpoint's), in step order: for a step
    recorded more than once (an attempt replayed it after a restart from an earlier checkpoint) its last record, the
    one the checkpoint's run went on from."""
    last: dict[tuple[str, int], dict[str, Any]] = {}
    try:
        with open(metrics_path, encoding="utf-8", errors="replace") as fh:
            for line in fh:
                try:
                    record = json.loads(line)
                except ValueError:
                    continue
                if (isinstance(record, dict) and record.get("split") in SPLITS and isinstance(record.get("step"), int)
                        and record["step"] <= through):
                    last[(record["split"], record["step"])] = record
    except OSError:
        return []
    return [last[key] for key in sorted(last, key=lambda k: (k[1], SPLITS.index(k[0])))]


def make_sink(name: str) -> Sink:
    """The tracker's sink: its module (:attr:`mgpucli.trackers.Spec.sink`) is imported here, on the tracking
    thread."""
    return importlib.import_module(specs.SPECS[name].sink).make()


class Tracking:
    """The trackers of one run, on rank 0. The training loop calls :meth:`log` with every record and :meth:`close`
    once at the end; everything else happens on the tracking thread."""

    def __init__(self, names: list[str], contexts: dict[str, Context], state: dict[str, dict[str, Any]],
                 run_dir: Path, write_event: Callable[[dict[str, Any]], None], reporter: Reporter,
                 earlier: list[dict[str, Any]] | None = None):
        self.names, self.run_dir = list(names), run_dir
        self._contexts, self._state = contexts, state
        self._write_event, self._reporter = write_event, reporter
        self._earlier = list(earlier or [])  # sent first: what a resumed run's trackers may have missed
        self._queue: queue.Queue = queue.Queue()
        self._notes: collections.deque = collections.deque()  # (kind, text, event record): said by the main thread
        self._lock = threading.Lock()
        self._sinks: dict[str, Sink] = {}
        self._last_step = 0
        self._faults = faults.enabled()
        self._thread = threading.Thread(target=self._work, name="mgpu-trackers", daemon=True)

    # ------------------------------------------------------------------------------------- main thread
    @classmethod
    def open(cls, cfg: Any, run_dir: Path, tags: dict[str, str], resumed_at: int | None,
             checkpoint_ids: dict[str, str] | None, write_event: Callable[[dict[str, Any]], None],
             reporter: Reporter) -> Tracking:
        """Start the trackers ``cfg.trainer.loggers`` names (their runs start on the tracking thread).
        ``resumed_at``: the step of the checkpoint the run continues from (None: a fresh start); its tracker runs go
        on (ids from trackers.json, else from the checkpoint)."""
        from omegaconf import OmegaConf

        trainer = cfg.trainer
        names = specs.trackers_in(specs.enabled(list(trainer.loggers), trainer.tensorboard))
        resuming = resumed_at is not None
        before = specs.read_state(run_dir) if resuming else {}
        recipe = OmegaConf.to_container(cfg, resolve=True)
        contexts, state = {}, {}
        for name in names:
            run_id = ((before.get(name) or {}).get("id") or (checkpoint_ids or {}).get(name)) if resuming else None
            continuing = run_id is not None
            new_run_id = specs.SPECS[name].new_run_id
            if run_id is None and new_run_id is not None:  # known, and in checkpoints, before the tracker starts
                run_id = new_run_id()
            contexts[name] = Context(run_dir=run_dir, name=str(cfg.name), recipe=recipe, tags=tags,
                                     options=OmegaConf.to_container(trainer[name], resolve=True), run_id=run_id,
                                     continuing=continuing)
            kept = before.get(name, {}) if continuing else {}  # a new run has logged nothing yet
            state[name] = {**kept, "id": run_id, "status": "running", "logged": kept.get("logged") or {}}
        earlier = backlog(run_dir / METRICS, resumed_at) if resuming else []
        tracking = cls(names, contexts, {**before, **state}, run_dir, write_event, reporter, earlier)
        tracking._save_state()
        tracking._thread.start()
        return tracking

    def ids(self) -> dict[str, str]:
        """Each tracker's run id as known now (for the checkpoint)."""
        with self._lock:
            return {name: entry["id"] for name, entry in self._state.items()
                    if name in self.names and entry.get("id")}

    def log(self, record: dict[str, Any]) -> None:
        """Queue a train or validation record (other records are not metrics), and say what the trackers had to
        say since the last one."""
        if record.get("split") in SPLITS and isinstance(record.get("step"), int):
            self._queue.put(("log", record))
        self._say()

    def close(self, status: str, checkpoints: dict[str, str]) -> None:
        """Finish every tracker's run with ``status`` (finished, failed or preempted) and the checkpoints' paths;
        waits a bounded time (a tracker still uploading then goes on without mgpu: its local files keep it)."""
        self._queue.put(("finish", (status, checkpoints)))
        limit = FINISH_TIMEOUT_S.get(status, 60.0)
        waited = f"within {limit:g} s"
        try:
            self._thread.join(limit)
        except KeyboardInterrupt:  # Ctrl-C while an upload finishes: stop waiting, let the run end
            waited = "before Ctrl-C"
        if self._thread.is_alive():
            busy = ", ".join(specs.SPECS[n].title for n in self._sinks) or "the trackers"
            self._notes.append(("warn", f"{busy} did not finish {waited}; mgpu stopped waiting (see "
                                f"{self.run_dir / specs.STATE_FILE} for where each run is)", None))
        self._say()

    def _say(self) -> None:
        while self._notes:
            kind, text, event = self._notes.popleft()
            if event is not None:
                self._write_event(event)
            (self._reporter.warn if kind == "warn" else self._reporter.message)(text)

    # ---------------------------------------------------------------------------------- tracking thread
    def _work(self) -> None:
        for name in self.names:
            self._start(name)
        caught_up = {name: 0 for name in self._sinks}
        for record in self._earlier:
            for name in self._log(record):
                caught_up[name] += 1
        for name, count in caught_up.items():
            if count:
                self._notes.append(("message", f"{specs.SPECS[name].title}: sent {count} earlier record(s) it had "
                                    f"missed (from {METRICS})", None))
        while True:
            kind, item = self._queue.get()
            if kind == "log":
                self._log(item)
            elif kind == "finish":
                self._finish(*item)
                return

    def _start(self, name: str) -> None:
        try:
            sink = make_sink(name)
            started = sink.start(self._contexts[name])
        except BaseException as err:  # noqa: BLE001 - any tracker failure leaves training alone
            self._failed(name, "starting", err)
            return
        self._sinks[name] = sink
        with self._lock:
            self._state[name].update(started.entry)
        self._save_state()
        if started.warn:
            self._notes.append(("warn", started.warn, None))
        if started.message:
            self._notes.append(("message", started.message, None))

    def _log(self, record: dict[str, Any]) -> list[str]:
        """Send one record to every tracker that does not hold its step yet; returns the trackers that took it."""
        split, step = record["split"], record["step"]
        self._last_step = step
        metrics, wall_time = metrics_of(record), float(record.get("time") or time.time())
        took = []
        for name, sink in list(self._sinks.items()):
            logged = self._state[name]["logged"]
            if step <= logged.get(split, -1):
                continue  # sent before a restart: a step is never sent twice
            try:
                if self._faults:
                    faults.maybe_fault("tracker", 0, step)
                sink.log(step, metrics, wall_time)
            except BaseException as err:  # noqa: BLE001
                self._failed(name, f"logging step {step}", err)
                continue
            with self._lock:
                logged[split] = step
            took.append(name)
        if took:
            self._save_state()
        return took

    def _finish(self, status: str, checkpoints: dict[str, str]) -> None:
        for name, sink in list(self._sinks.items()):
            try:
                sink.finish(status, checkpoints)
            except BaseException as err:  # noqa: BLE001
                self._failed(name, "finishing its run", err)
                continue
            with self._lock:
                self._state[name]["status"] = status
            del self._sinks[name]
        self._save_state()

    def _failed(self, name: str, doing: str, err: BaseException) -> None:
        """Switch the tracker off for the rest of the run: one warning, an event record, a note in trackers.json."""
        self._sinks.pop(name, None)
        title = specs.SPECS[name].title
        error = f"{type(err).__name__}: {' '.join(str(err).split())[:500]}"
        failure = {"step": self._last_step, "while": doing, "error": error, "time": time.time()}
        with self._lock:
            entry = self._state.setdefault(name, {})
            entry["failures"] = [*entry.get("failures", []), failure]
        self._save_state()
        self._notes.append((
            "warn",
            f"{title} failed while {doing} ({error}); mgpu sends it nothing more in this run. Training and "
            f"checkpoints go on; {METRICS} has every record.",
            {"split": "event", "event": "tracker_failed", "tracker": name, "step": self._last_step, "while": doing,
             "error": error, "time": failure["time"]},
        ))

    def _save_state(self) -> None:
        with self._lock:
            state = json.loads(json.dumps(self._state))
        try:
            specs.write_state(self.run_dir, state)
        except OSError:
            pass  # the run dir's record is a convenience; the trackers and metrics.jsonl are the records
