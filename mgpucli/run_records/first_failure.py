"""Which rank of an attempt failed first (read from the files torch and the workers wrote, and from when and how each
worker ended, as the launcher saw it: ``Attempt.exits``).

When one worker dies, torch's agent stops the others, and they often fail too ("connection closed by peer", or
the SIGTERM the agent sent, or its SIGKILL once its shutdown window is over). The launcher's summary and the
post-mortem must name the rank that started it, so failures are ordered by how likely each is to be the cause,
then by time:

-1. a collective timeout mgpu diagnosed (it names the ranks that had not arrived);
0. killed by a signal the teardown does not send (SIGKILL from outside, SIGSEGV, SIGABRT, ...), or by any signal
   when the launcher saw that rank end first (a SIGTERM from outside is a cause too);
1. an exception that is not a collective/connection error (the worker's own bug, a NaN, an injected fault);
2. a non-zero exit with no error recorded;
3. a collective or connection error (the usual echo of another rank's death), or a graceful stop;
4. ended by the teardown: killed by a signal (SIGTERM, SIGKILL, ...) after another worker of the attempt had
   ended with a failure (:func:`torn_down`), or, where the launcher did not see the workers end, by the signal
   the agent's teardown sends (SIGTERM, SIGINT, ...).

Times come from ``mgpu_failure.json`` (sub-second), the launcher's exit times, or torch's error file (whole
seconds).
"""

from __future__ import annotations

import re
import signal
import time
from collections.abc import Mapping
from dataclasses import dataclass

from mgpucli.errors import EXIT_FAILED, EXIT_PREEMPTED, EXIT_USAGE
from mgpucli.run_records import stacks
from mgpucli.run_records.launch_record import Attempt, RankExit, RankFiles
from mgpucli.run_records.worker_records import FailureRecord, finished, read_error_file, read_record, record_path

TEARDOWN_SIGNALS = {signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1}
# What ends the workers of a failed attempt: torch's agent (SIGTERM, then SIGKILL after its window) and the launcher
# (SIGKILL after its grace, mgpucli.launch.exit_watch).
ENDING_SIGNALS = TEARDOWN_SIGNALS | {signal.SIGKILL}
_PEER = re.compile(
    r"connection (closed|reset|refused)|broken pipe|DistBackendError|ProcessGroupGloo|NCCL|timed? ?out|"
    r"Socket Timeout|recvBytes|sendBytes|stopped by (a signal|SIG[A-Z0-9]+)|SignalException|KeyboardInterrupt|"
    r"Preempted|lost its connection to another rank",
    re.IGNORECASE,
)
TEARDOWN_CATEGORY = 4  # RankFailure.category of a rank stopped by the agent's teardown signal
TORN_DOWN = "ended by the teardown"  # how the launcher and the post-mortem say it of a rank (:func:`torn_down`)
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
    ended: RankExit | None = None  # when and how the launcher saw its worker end (None: not seen)
    torn_down: bool = False  # ended by the attempt's teardown after another rank failed (:func:`torn_down`)

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
        if self.torn_down:
            return TEARDOWN_CATEGORY
        if self.exitcode is not None and self.exitcode < 0:
            if self.ended is not None:
                return 0  # the launcher saw it end, not after another failure: a signal from outside
            try:
                sig = signal.Signals(-self.exitcode)
            except ValueError:
                return 0
            return TEARDOWN_CATEGORY if sig in TEARDOWN_SIGNALS else 0
        if not text:
            return 2
        return 3 if _PEER.search(text) else 1

    def describe(self) -> str:
        if self.torn_down:
            return f"{TORN_DOWN} with {self.signal_name}" if self.signal_name else TORN_DOWN
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
    ending = torn_down(attempt, exitcodes)
    for rank, files in sorted(attempt.ranks.items()):
        record = failure_record_of(files)
        message, trace, stamp = read_error_file(files.error_file)
        ended = attempt.exits.get(rank)
        if exitcodes is not None:
            if rank not in exitcodes:
                continue
            code: int | None = exitcodes[rank]
        elif ended is not None and ended.code not in (0, None):
            code = ended.code
        else:
            if record is None and message is None:
                continue
            code = record.exit_code if record is not None else None
        if message is None and record is not None:
            message = f"{record.type}: {record.message}"
        when = record.time if record is not None else ended.time if ended is not None else stamp
        failures.append(RankFailure(
            rank=rank, local_rank=files.local_rank, exitcode=code, message=message, traceback=trace,
            time=when, record=record, stdout=files.stdout, stderr=files.stderr, error_file=files.error_file,
            ended=ended, torn_down=rank in ending,
        ))
    failures.sort(key=lambda f: (f.category, f.time if f.time is not None else float("inf"), f.rank))
    if all_refused(failures):  # which rank exited first is chance: the lowest that said the message in full
        failures.sort(key=lambda f: (_stopped_before_it_said(f), f.rank))
    return failures


def torn_down(attempt: Attempt, exitcodes: Mapping[int, int] | None = None) -> set[int]:
    """The ranks of ``attempt`` its teardown ended: killed by a signal the teardown sends (SIGTERM, SIGKILL, ...)
    after another of its workers had ended with a failure (:func:`first_to_fail`). Empty when the launcher did not
    see the workers end."""
    first = first_to_fail(attempt, exitcodes)
    if first is None:
        return set()
    after = attempt.exits[first].time if first in attempt.exits else float("-inf")
    return {rank for rank, code in _exit_codes(attempt, exitcodes).items() if code is not None and code < 0
            and _signal_of(code) in ENDING_SIGNALS and attempt.exits[rank].time > after}


def first_to_fail(attempt: Attempt, exitcodes: Mapping[int, int] | None = None) -> int | None:
    """The rank whose worker ended first with a failure (any non-zero exit code, a graceful stop's included: torch's
    agent tears the others down then), from ``attempt.exits``, the launcher's record of when and how each worker
    ended (a code it could not read is torch's, from ``exitcodes``); None when it saw none end so.

    A rank that torch reports exited with a code of its own (not a signal) but that the launcher never saw end had
    ended before the launcher found it among its workers (:mod:`mgpucli.launch.exit_watch`): that is before any
    worker it saw end, so it comes first (the lowest such rank)."""
    if not attempt.exits:
        return None
    unseen = sorted(rank for rank, code in (exitcodes or {}).items() if rank not in attempt.exits and code > 0)
    if unseen:
        return unseen[0]
    failed = [(attempt.exits[rank].time, rank) for rank, code in _exit_codes(attempt, exitcodes).items()
              if code not in (0, None)]
    return min(failed)[1] if failed else None


def _exit_codes(attempt: Attempt, exitcodes: Mapping[int, int] | None) -> dict[int, int | None]:
    return {rank: ended.code if ended.code is not None else (exitcodes or {}).get(rank)
            for rank, ended in attempt.exits.items()}


def _signal_of(code: int) -> signal.Signals | None:
    try:
        return signal.Signals(-code)
    except ValueError:
        return None


@dataclass(frozen=True)
class EarlyExit:
    """A rank that ended with exit code 0 while the others still waited for it (:func:`early_exit`)."""

    rank: int
    time: float
    waiting_rank: int
    waiting_in: str | None  # the torch.distributed function the waiting rank was in ("barrier"), if its traceback says
    waiting_at: str | None  # where in the user's code ("main.py:14")

    def describe(self) -> str:
        """``rank 1 exited with code 0 at 12:01:03 while rank 0 waited in barrier at main.py:14``."""
        where = (f" in {self.waiting_in}" if self.waiting_in else "") + (f" at {self.waiting_at}" if self.waiting_at
                                                                         else "")
        return (f"rank {self.rank} exited with code 0 at {time.strftime('%H:%M:%S', time.localtime(self.time))} "
                f"while rank {self.waiting_rank} {'waited' + where if where else 'still ran'}")


_TB_FRAME = re.compile(r'^\s*File "(?P<file>[^"]+)", line (?P<line>\d+), in (?P<func>\S+)')
_TORCH_DISTRIBUTED = re.compile(r"/torch/distributed/")


def early_exit(attempt: Attempt, failures: list[RankFailure]) -> EarlyExit | None:
    """When the first failure (``failures[0]``) is an echo (a lost connection, a timeout) and a rank of the attempt had
    ended with exit code 0 before it, while the failing rank still ran: that rank, which the others waited for (the
    earliest, if several). None otherwise, or when the launcher did not see the workers end."""
    if not failures or failures[0].category not in (-1, 3):
        return None
    first = failures[0]
    failed_at = first.ended.time if first.ended is not None else first.time
    failed = {f.rank for f in failures}  # a code the launcher could not read is 0 when torch reported no failure
    early = sorted((ended.time, rank) for rank, ended in attempt.exits.items()
                   if (ended.code == 0 or (ended.code is None and rank not in failed)) and rank != first.rank
                   and (failed_at is None or ended.time < failed_at))
    if not early:
        return None
    at, rank = early[0]
    waiting_in, waiting_at = _waiting_call(first.traceback)
    return EarlyExit(rank, at, first.rank, waiting_in, waiting_at)


def _waiting_call(trace: str | None) -> tuple[str | None, str | None]:
    """From a traceback: the torch.distributed function its innermost frame is in ("barrier"), and the innermost
    frame of the user's own code ("main.py:14")."""
    frames = [m for m in (_TB_FRAME.match(line) for line in (trace or "").splitlines()) if m]
    inner = frames[-1] if frames else None
    call = inner["func"] if inner is not None and _TORCH_DISTRIBUTED.search(inner["file"]) else None
    mine = next((m for m in reversed(frames) if stacks.users_code(m["file"])), None)
    return call, f"{mine['file']}:{mine['line']}" if mine is not None else None


def all_refused(failures: list[RankFailure]) -> bool:
    """Bad input (a recipe, a checkpoint) that no worker could use: every rank that failed exited with EXIT_USAGE.

    A rank that the agent's teardown signal killed counts too when its own record says it was exiting with
    EXIT_USAGE: once one rank has exited, torch's agent SIGTERMs the others, which may still be on their way out
    with the same error; so does one the teardown ended (:func:`torn_down`) before it recorded anything, still
    building what the first rank refused. A rank killed first, or before any other failed, was not refused: the
    input may be bad for one rank only (a dataset only rank 0 builds)."""
    def refused(f: RankFailure) -> bool:
        return f.exitcode == EXIT_USAGE or (f.category == TEARDOWN_CATEGORY and _recorded_code(f) == EXIT_USAGE)

    return any(refused(f) for f in failures) and all(refused(f) or _stopped_before_it_said(f) for f in failures)


def _recorded_code(f: RankFailure) -> int | None:
    return f.record.exit_code if f.record is not None else None


def _stopped_before_it_said(f: RankFailure) -> bool:
    """The teardown ended the rank before it recorded anything (:func:`all_refused`)."""
    return f.torn_down and _recorded_code(f) is None


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


def stopped_gracefully(failures: list[RankFailure]) -> bool:
    """Every failed rank stopped on a signal with the checkpoint saved (exit code EXIT_PREEMPTED), but those the
    teardown ended once the first of them had left (they were on their way out of the same stop)."""
    own = [f for f in failures if not f.torn_down]
    return bool(own) and all(f.exitcode == EXIT_PREEMPTED for f in own)


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
