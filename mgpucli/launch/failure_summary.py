"""The failure summary ``mgpu launch`` prints when a job fails: the rank that failed first (see
:mod:`mgpucli.run_records.first_failure`), its exception and traceback, and the last lines of its log.
"""

from __future__ import annotations

import re

from mgpucli.errors import EXIT_USAGE
from mgpucli.run_records import stacks
from mgpucli.run_records.first_failure import RankFailure, all_refused, early_exit
from mgpucli.run_records.launch_record import Attempt
from mgpucli.run_records.worker_records import log_tail

TAIL_LINES = 10
TRACE_LINES = 12
_CARETS = re.compile(r"^\s*[\^~]+\s*$")  # Python 3.11's underlining of the failing expression
_PREFIX = re.compile(r"^\[rank\d+\]:")  # the line prefix mgpu asks torch to put on tee'd lines


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
    left = early_exit(attempt, failures)
    which = f"attempt {attempt.attempt + 1} of {total_attempts}"
    if refused:  # the same bad input on every rank: rank 0 said it in full (the others stay quiet)
        out = [f"every rank stopped on bad input (exit code {EXIT_USAGE}) in {which}; rank {first.rank} said:"]
    elif left is not None:  # the others failed because it had gone: it is the cause
        out = [f"{left.describe()} ({which}): rank {left.rank} ended while the others still needed it, so rank "
               f"{first.rank} failed ({first.describe()}) when it lost its connection to it."]
    else:
        out = [f"rank {first.rank} failed first ({first.describe()}) in {which}."]
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
    log_path = first.stderr if log_tail(first.stderr, TAIL_LINES) else first.stdout
    shown = {line.strip() for line in (first.traceback or "").splitlines()}
    last = [line for line in log_tail(log_path, lines=200) if _PREFIX.sub("", line).strip() not in shown
            and not _CARETS.match(_PREFIX.sub("", line))][-TAIL_LINES:]
    if last:
        out.append(f"  last lines of {log_path}" + (" (traceback lines left out):" if trace else ":"))
        out += [f"    {line}" for line in last]
    others = [f"rank {f.rank} ({f.describe()})" for f in failures if f is not first]
    if others:
        out.append(f"  also stopped: {', '.join(others)}")
    since = first.time - 60 if first.time is not None else None  # dumps asked for at this failure, not earlier
    dumps = stacks.dumps_of({rank: stacks.stacks_path(files.error_file) for rank, files in attempt.ranks.items()
                             if files.error_file and rank != first.rank}, since=since)
    if dumps:
        out.append("  where the other ranks were when it failed (their Python stacks, stacks.txt beside their logs):")
        out += [f"    {stacks.describe(rank, dump)}" for rank, dump in dumps.items()]
    out.append(f"  all logs: {attempt.dir or '(none)'}; index: {launch_json}")
    return "\n".join(out)
