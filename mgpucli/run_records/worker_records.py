"""What a worker leaves beside torch's ``error.json``: how it failed, and that its training started.

torch's ``@record`` error file holds the exception's message and traceback but not the training step, and only for
exceptions (not for a clean ``sys.exit(1)`` after an mgpu error). mgpu's worker entry writes ``mgpu_failure.json``
beside it with what the launcher needs to decide about a restart: exception type, message, the step it happened
at, whether retrying can help, and a precise time. A worker also leaves ``mgpu_started`` there once its training
started, and ``mgpu_finished`` once the run finished. The launcher and the post-mortem read these files; neither
captures output itself.
"""

from __future__ import annotations

import json
import os
import re
import time
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any

from mgpucli.env_vars import ERROR_FILE
from mgpucli.errors import EXIT_PREEMPTED, EXIT_USAGE, Preempted
from mgpucli.run_records.json_files import read_json_object, write_json

RECORD_NAME = "mgpu_failure.json"
STARTED_NAME = "mgpu_started"  # a worker's mark that its training started (set-up done, run dir taken)
FINISHED_NAME = "mgpu_finished"  # a worker's mark that the run finished (every rank agreed, final checkpoint complete)
ERROR_FILE_ENV = ERROR_FILE  # where torch's agent wants this worker's error file
PROGRESS_NAME = "mgpu_progress.json"  # the rank's step and phase, rewritten every second by its heartbeat
ENDED = "ended"  # the phase of a rank whose work is done (its heartbeat's last beat)

# A non-finite loss comes back on every retry from the same checkpoint: retrying only burns restarts.
_NAN = re.compile(r"\b(nan|non-finite|not finite)\b", re.IGNORECASE)
_STEP = re.compile(r"\bstep (\d+)\b")


@dataclass(frozen=True)
class FailureRecord:
    """How one worker failed."""

    rank: int
    local_rank: int
    attempt: int
    time: float
    type: str
    message: str
    step: int | None = None
    exit_code: int | None = None
    retryable: bool = True
    signal: str | None = None  # a graceful stop (Preempted): the signal this rank received, if it got one itself

    def signature(self) -> tuple[str, str, int] | None:
        """What "the same failure" means: same exception type and message at the same step (None: unknown step)."""
        if self.step is None:
            return None
        return (self.type, self.message, self.step)


def is_retryable(exc: BaseException, exit_code: int | None) -> bool:
    """False for failures a restart from the last checkpoint reproduces (bad input, a NaN, an error that says so),
    and for a graceful stop on a signal (preemption: the job is meant to stop, not to start over)."""
    if exit_code in (EXIT_USAGE, EXIT_PREEMPTED):
        return False  # UsageError: the same input gives the same answer
    flag = getattr(exc, "retryable", None)
    if flag is not None:
        return bool(flag)
    return _NAN.search(str(exc)) is None


def failure_step(exc: BaseException) -> int | None:
    """The training step a failure happened at: ``exc.mgpu_step`` when the engine tagged it, else the
    ``step N`` its message names (mgpu's NaN error and injected faults do), else None (unknown).

    A graceful stop (Preempted) is not a failure in a step: its step is the last one completed, the step its
    checkpoint holds (``mgpu_step`` is the step in progress, one more)."""
    if isinstance(exc, Preempted) and exc.step is not None:
        return exc.step
    tagged = getattr(exc, "mgpu_step", None)
    if isinstance(tagged, int):
        return tagged
    found = _STEP.search(str(exc))
    return int(found.group(1)) if found else None


def record_path(error_file: str) -> str:
    """Where the record goes: next to torch's error file (``.../attempt_N/LOCAL_RANK/error.json``)."""
    return os.path.join(os.path.dirname(error_file), RECORD_NAME)


def mark_started(details: Mapping[str, Any] | None = None, environ: Mapping[str, str] | None = None) -> None:
    """Under torchrun, leave ``mgpu_started`` beside this worker's error file: its training started. The launcher
    makes this launch the run dir's record of the run only then, so a launch that fails before training never
    replaces an earlier run's ``launch.json`` (see :meth:`mgpucli.run_records.launch_record.LaunchRecord.promote`).
    ``details`` (a recipe's: the step training starts after, its layout) go on the mark's second line, as JSON
    (:func:`started_details`)."""
    # the log dir gone or read-only: the launcher keeps the record where it started it
    _mark(STARTED_NAME, environ, json.dumps(dict(details)) if details else "")


def mark_finished(environ: Mapping[str, str] | None = None) -> None:
    """Under torchrun, leave ``mgpu_finished`` beside this worker's error file: the run finished on every rank and
    its final checkpoint is complete. A signal that reaches the launcher later, during the teardown, then leaves
    the run finished (exit 0), not stopped."""
    _mark(FINISHED_NAME, environ)


def _mark(name: str, environ: Mapping[str, str] | None, more: str = "") -> None:
    error_file = (os.environ if environ is None else environ).get(ERROR_FILE_ENV)
    if not error_file:
        return
    try:
        os.makedirs(os.path.dirname(error_file), exist_ok=True)
        with open(os.path.join(os.path.dirname(error_file), name), "w") as fh:
            fh.write(f"{time.time()}\n" + (f"{more}\n" if more else ""))
    except OSError:
        pass


def started(error_file: str) -> bool:
    """Whether the worker whose error file is ``error_file`` marked its training as started."""
    return bool(error_file) and os.path.exists(os.path.join(os.path.dirname(error_file), STARTED_NAME))


def started_at(error_file: str) -> float | None:
    """When the worker whose error file is ``error_file`` marked its start (None: no mark, or unreadable)."""
    if not error_file:
        return None
    try:
        with open(os.path.join(os.path.dirname(error_file), STARTED_NAME)) as fh:
            return float(fh.readline().strip())
    except (OSError, ValueError):
        return None


def started_details(error_file: str) -> dict[str, Any] | None:
    """What the worker whose error file is ``error_file`` said as its training started (:func:`mark_started`), or
    None (no mark, none said)."""
    if not error_file:
        return None
    try:
        with open(os.path.join(os.path.dirname(error_file), STARTED_NAME)) as fh:
            fh.readline()
            found = json.loads(fh.readline() or "null")
    except (OSError, ValueError):
        return None
    return found if isinstance(found, dict) else None


def log_tail(path: str, lines: int = 10, max_bytes: int = 65536) -> list[str]:
    """The last ``lines`` non-empty lines of a worker's log file ([] when missing)."""
    if not path or not os.path.isfile(path):
        return []
    with open(path, "rb") as fh:
        fh.seek(0, os.SEEK_END)
        size = fh.tell()
        fh.seek(max(0, size - max_bytes))
        data = fh.read().decode("utf-8", errors="replace")
    return [line for line in data.splitlines() if line.strip()][-lines:]


def finished(error_file: str) -> bool:
    """Whether the worker whose error file is ``error_file`` marked the run as finished (:func:`mark_finished`)."""
    return bool(error_file) and os.path.exists(os.path.join(os.path.dirname(error_file), FINISHED_NAME))


def progress_path(error_file: str) -> str:
    """Where a worker's heartbeat writes its progress: beside its error file."""
    return os.path.join(os.path.dirname(error_file), PROGRESS_NAME)


def read_progress(error_file: str) -> dict | None:
    """The worker's last ``{step, phase, time}`` (None when it wrote none yet)."""
    data = read_json_object(progress_path(error_file)) if error_file else None
    return data if data is not None and "step" in data else None


def write_record(path: str, record: FailureRecord) -> None:
    write_json(path, asdict(record))


def read_record(path: str) -> FailureRecord | None:
    """The record at ``path``, or None when there is none (or it cannot be read: a killed writer)."""
    data = read_json_object(path)
    try:
        return FailureRecord(**data) if data is not None else None
    except TypeError:
        return None


def read_error_file(path: str | None) -> tuple[str | None, str | None, float | None]:
    """(message, traceback, timestamp) from torch's ``@record`` error file, Nones where absent."""
    data = read_json_object(path) if path else None
    message = data.get("message") if data is not None else None
    if isinstance(message, str):
        return message, None, None
    if not isinstance(message, dict):
        return None, None, None
    extra = message.get("extraInfo") or {}
    stamp = extra.get("timestamp")
    try:
        stamp_seconds = float(stamp) if stamp is not None else None
    except ValueError:
        stamp_seconds = None
    return message.get("message"), extra.get("py_callstack"), stamp_seconds
