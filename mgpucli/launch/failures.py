"""Which rank failed first, and a short summary of why (pure: reads the files torch and the workers wrote).

When one worker dies, torch's agent stops the others, and they often fail too ("connection closed by
peer", or the SIGTERM the agent sent). The summary must name the rank that started it, so failures are
ordered by how likely each is to be the cause, then by time:

0. killed by a signal the agent does not send on teardown (SIGKILL from outside, SIGSEGV, SIGABRT, ...);
1. an exception that is not a collective/connection error (the worker's own bug, a NaN, an injected fault);
2. a non-zero exit with no error recorded;
3. a collective or connection error (the usual echo of another rank's death), or a graceful stop;
4. stopped by the agent's teardown signal (SIGTERM, SIGINT, ...).

Times come from ``mgpu_failure.json`` (sub-second) or torch's error file (whole seconds).
"""

from __future__ import annotations

import os
import re
import signal
from collections.abc import Mapping
from dataclasses import dataclass

from mgpucli.errors import EXIT_PREEMPTED, EXIT_USAGE
from mgpucli.launch.index import Attempt
from mgpucli.launch.records import RECORD_NAME, FailureRecord, read_error_file, read_record

TEARDOWN_SIGNALS = {signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1}
_PEER = re.compile(
    r"connection (closed|reset|refused)|broken pipe|DistBackendError|ProcessGroupGloo|NCCL|timed? ?out|"
    r"Socket Timeout|recvBytes|sendBytes|stopped by (a signal|SIG[A-Z0-9]+)|SignalException|KeyboardInterrupt|"
    r"Preempted|lost its connection to another rank",
    re.IGNORECASE,
)
_DIAGNOSED_TIMEOUT = "Ranks that had not arrived:"  # mgpucli.engine.clear_errors.collective_failure
TAIL_LINES = 10
TRACE_LINES = 12
_CARETS = re.compile(r"^\s*[\^~]+\s*$")  # Python 3.11's underlining of the failing expression
_PREFIX = re.compile(r"^\[rank\d+\]:")  # the line prefix mgpu asks torch to put on tee'd lines


@dataclass
class RankFailure:
    """One failed rank of one attempt, with everything the summary shows."""

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
            return 4 if sig in TEARDOWN_SIGNALS else 0
        if not text:
            return 2
        return 3 if _PEER.search(text) else 1

    def describe(self) -> str:
        if self.signal_name:
            return f"killed by {self.signal_name}"
        if self.exitcode is not None:
            return f"exit code {self.exitcode}"
        return "failed"


def collect(attempt: Attempt, exitcodes: Mapping[int, int] | None = None) -> list[RankFailure]:
    """The failed ranks of ``attempt``, most likely cause first.

    ``exitcodes`` (global rank -> exit code) come from torch's agent when it reports the failure; without
    them (a restart refused before it started) a rank counts as failed when it left an error behind.
    """
    failures = []
    for rank, files in sorted(attempt.ranks.items()):
        rec = read_record(os.path.join(os.path.dirname(files.error_file), RECORD_NAME)) if files.error_file else None
        message, trace, stamp = read_error_file(files.error_file)
        if exitcodes is not None:
            if rank not in exitcodes:
                continue
            code: int | None = exitcodes[rank]
        else:
            if rec is None and message is None:
                continue
            code = rec.exit_code if rec is not None else None
        if message is None and rec is not None:
            message = f"{rec.type}: {rec.message}"
        failures.append(RankFailure(
            rank=rank, local_rank=files.local_rank, exitcode=code, message=message, traceback=trace,
            time=rec.time if rec is not None else stamp, record=rec,
            stdout=files.stdout, stderr=files.stderr, error_file=files.error_file,
        ))
    failures.sort(key=lambda f: (f.category, f.time if f.time is not None else float("inf"), f.rank))
    return failures


def all_refused(failures: list[RankFailure]) -> bool:
    """Every failed rank exited with EXIT_USAGE: bad input (a recipe, a checkpoint) that no worker could use."""
    return bool(failures) and all(f.exitcode == EXIT_USAGE for f in failures)


def preempted(attempt: Attempt) -> list[FailureRecord]:
    """The ranks of ``attempt`` (on this node) that stopped gracefully on a signal with a checkpoint saved (exit
    code EXIT_PREEMPTED), or [] unless every rank that left a record did."""
    records = []
    for files in attempt.ranks.values():
        if files.error_file:
            rec = read_record(os.path.join(os.path.dirname(files.error_file), RECORD_NAME))
            if rec is not None:
                records.append(rec)
    if records and all(r.exit_code == EXIT_PREEMPTED for r in records):
        return records
    return []


def tail(path: str, lines: int = TAIL_LINES, max_bytes: int = 65536) -> list[str]:
    """The last ``lines`` non-empty lines of a text file ([] when missing)."""
    if not path or not os.path.isfile(path):
        return []
    with open(path, "rb") as fh:
        fh.seek(0, os.SEEK_END)
        size = fh.tell()
        fh.seek(max(0, size - max_bytes))
        data = fh.read().decode("utf-8", errors="replace")
    return [line for line in data.splitlines() if line.strip()][-lines:]


def _short_trace(trace: str | None) -> list[str]:
    if not trace:
        return []
    lines = [line for line in trace.rstrip().splitlines() if line.strip() and not _CARETS.match(line)]
    if len(lines) <= TRACE_LINES:
        return lines
    return [lines[0], "  ...", *lines[-(TRACE_LINES - 2) :]]


def summarize(failures: list[RankFailure], attempt: Attempt, total_attempts: int, launch_json: str) -> str:
    """A short report: the first failing rank, its exception and traceback, the last lines of its log."""
    if not failures:
        return f"the job failed in attempt {attempt.attempt}, but no rank left an error; logs: {attempt.dir}"
    first = failures[0]
    refused = all_refused(failures)
    if refused:  # the same bad input on every rank: rank 0 said it in full (the others stay quiet)
        first = min(failures, key=lambda f: f.rank)
        out = [f"every rank stopped on bad input (exit code {EXIT_USAGE}) in attempt {attempt.attempt + 1} of "
               f"{total_attempts}; rank {first.rank} said:"]
    else:
        out = [f"rank {first.rank} failed first ({first.describe()}) in attempt {attempt.attempt + 1} of "
               f"{total_attempts}."]
    if refused:
        pass  # the log's last lines below hold the whole message and its fix
    elif first.message:
        out.append(f"  {first.message}")
    elif first.signal_name:
        out.append(f"  the process was killed by {first.signal_name} (from outside the job, the OOM killer, "
                   "or a crash in native code)")
    trace = _short_trace(first.traceback)
    if trace:
        out.append("  traceback (from torch's error file):")
        out += [f"    {line}" for line in trace]
    log_path = first.stderr if tail(first.stderr) else first.stdout
    shown = {line.strip() for line in (first.traceback or "").splitlines()}
    last = [line for line in tail(log_path, lines=200) if _PREFIX.sub("", line).strip() not in shown
            and not _CARETS.match(_PREFIX.sub("", line))][-TAIL_LINES:]
    if last:
        out.append(f"  last lines of {log_path}" + (" (traceback lines left out):" if trace else ":"))
        out += [f"    {line}" for line in last]
    others = [f"rank {f.rank} ({f.describe()})" for f in failures if f is not first]
    if others:
        out.append(f"  also stopped: {', '.join(others)}")
    out.append(f"  all logs: {attempt.dir or '(none)'}; index: {launch_json}")
    return "\n".join(out)
