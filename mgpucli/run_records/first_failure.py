"""Which rank of an attempt failed first (read from the files torch and the workers wrote).

When one worker dies, torch's agent stops the others, and they often fail too ("connection closed by peer", or
the SIGTERM the agent sent). The launcher's summary and the post-mortem must name the rank that started it, so
failures are ordered by how likely each is to be the cause, then by time:

0. killed by a signal the agent does not send on teardown (SIGKILL from outside, SIGSEGV, SIGABRT, ...);
1. an exception that is not a collective/connection error (the worker's own bug, a NaN, an injected fault);
2. a non-zero exit with no error recorded;
3. a collective or connection error (the usual echo of another rank's death), or a graceful stop;
4. stopped by the agent's teardown signal (SIGTERM, SIGINT, ...).

Times come from ``mgpu_failure.json`` (sub-second) or torch's error file (whole seconds).
"""

from __future__ import annotations

import re
import signal
from collections.abc import Mapping
from dataclasses import dataclass

from mgpucli.errors import EXIT_FAILED, EXIT_PREEMPTED, EXIT_USAGE
from mgpucli.run_records.launch_record import Attempt, RankFiles
from mgpucli.run_records.worker_records import FailureRecord, finished, read_error_file, read_record, record_path

TEARDOWN_SIGNALS = {signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1}
_PEER = re.compile(
    r"connection (closed|reset|refused)|broken pipe|DistBackendError|ProcessGroupGloo|NCCL|timed? ?out|"
    r"Socket Timeout|recvBytes|sendBytes|stopped by (a signal|SIG[A-Z0-9]+)|SignalException|KeyboardInterrupt|"
    r"Preempted|lost its connection to another rank",
    re.IGNORECASE,
)
TEARDOWN_CATEGORY = 4  # RankFailure.category of a rank stopped by the agent's teardown signal
_DIAGNOSED_TIMEOUT = "Ranks that had not arrived:"  # mgpucli.engine.clear_errors.collective_failure


@dataclass
class RankFailure:
    """One failed rank of one attempt, with everything the launcher's summary shows."""

    rank: int
    local_rank: int
    exitcode: int | None  # negative: killed by that signal; None: unknown
    message: str | None
    traceback: str | None
    time: float | None
    record: FailureRecord | None
    stdout: str
    stderr: str
    error_file: str

    @property
    def signal_name(self) -> str | None:
        if self.exitcode is None or self.exitcode >= 0:
            return None
        try:
            return signal.Signals(-self.exitcode).name
        except ValueError:
            return f"signal {-self.exitcode}"

    @property
    def category(self) -> int:
        text = self.message or (self.record.message if self.record else None)
        if text and _DIAGNOSED_TIMEOUT in text:
            # mgpu's own timeout report names the late ranks; they are often SIGKILLed later by torch's
            # teardown, which must not make them look like the first failure.
            return -1
        if self.exitcode is not None and self.exitcode < 0:
            try:
                sig = signal.Signals(-self.exitcode)
            except ValueError:
                return 0
            return TEARDOWN_CATEGORY if sig in TEARDOWN_SIGNALS else 0
        if not text:
            return 2
        return 3 if _PEER.search(text) else 1

    def describe(self) -> str:
        if self.signal_name:
            return f"killed by {self.signal_name}"
        if self.exitcode is not None:
            return f"exit code {self.exitcode}"
        return "failed"


def failure_record_of(files: RankFiles) -> FailureRecord | None:
    """The ``mgpu_failure.json`` a rank left in this attempt, if any."""
    return read_record(record_path(files.error_file)) if files.error_file else None


def failure_records(attempt: Attempt) -> list[FailureRecord]:
    """Every failure record the ranks of ``attempt`` (on this node) left."""
    found = (failure_record_of(files) for files in attempt.ranks.values())
    return [record for record in found if record is not None]


def collect(attempt: Attempt, exitcodes: Mapping[int, int] | None = None) -> list[RankFailure]:
    """The failed ranks of ``attempt``, most likely cause first.

    ``exitcodes`` (global rank -> exit code) come from torch's agent when it reports the failure; without
    them (a restart refused before it started) a rank counts as failed when it left an error behind.
    """
    failures = []
    for rank, files in sorted(attempt.ranks.items()):
        record = failure_record_of(files)
        message, trace, stamp = read_error_file(files.error_file)
        if exitcodes is not None:
            if rank not in exitcodes:
                continue
            code: int | None = exitcodes[rank]
        else:
            if record is None and message is None:
                continue
            code = record.exit_code if record is not None else None
        if message is None and record is not None:
            message = f"{record.type}: {record.message}"
        failures.append(RankFailure(
            rank=rank, local_rank=files.local_rank, exitcode=code, message=message, traceback=trace,
            time=record.time if record is not None else stamp, record=record,
            stdout=files.stdout, stderr=files.stderr, error_file=files.error_file,
        ))
    failures.sort(key=lambda f: (f.category, f.time if f.time is not None else float("inf"), f.rank))
    if all_refused(failures):  # which rank exited first is chance; the lowest (rank 0) said the message in full
        failures.sort(key=lambda f: f.rank)
    return failures


def all_refused(failures: list[RankFailure]) -> bool:
    """Bad input (a recipe, a checkpoint) that no worker could use: every failed rank exited with EXIT_USAGE.

    A rank that the agent's teardown signal killed counts too when its own record says it was exiting with
    EXIT_USAGE: once one rank has exited, torch's agent SIGTERMs the others, which may still be on their way out
    with the same error. A rank killed before it recorded anything was not refused: the input may be bad for one
    rank only (a dataset only rank 0 builds)."""
    def refused(f: RankFailure) -> bool:
        recorded = f.record is not None and f.record.exit_code == EXIT_USAGE
        return f.exitcode == EXIT_USAGE or (f.category == TEARDOWN_CATEGORY and recorded)

    return bool(failures) and all(refused(f) for f in failures)


def job_exit_code(failures: list[RankFailure]) -> int:
    """The exit code ``mgpu launch`` passes on for a user's script that failed: the exit code of the rank that failed
    first (``failures[0]``, see :func:`collect`), so a script that exits 3 on every rank makes the launch exit 3;
    128+N for a rank killed by signal N, as a shell reports it; 1 when the code is unknown. Never 0."""
    code = failures[0].exitcode if failures else None
    if code is None or code == 0:
        return EXIT_FAILED
    if code < 0:
        return 128 + (-code)
    return code


def preempted(attempt: Attempt) -> list[FailureRecord]:
    """The ranks of ``attempt`` (on this node) that stopped gracefully on a signal with a checkpoint saved (exit
    code EXIT_PREEMPTED), or [] unless every rank that left a record did."""
    records = failure_records(attempt)
    if records and all(r.exit_code == EXIT_PREEMPTED for r in records):
        return records
    return []


def all_finished(attempt: Attempt) -> bool:
    """Whether every rank of ``attempt`` (on this node) marked the run as finished, its final checkpoint complete
    (:func:`mgpucli.run_records.worker_records.mark_finished`)."""
    return bool(attempt.ranks) and all(finished(files.error_file) for files in attempt.ranks.values())
