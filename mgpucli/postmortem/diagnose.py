"""The diagnosis: did the run finish; if not, which rank failed first, when, why, and what to do.

Which rank failed *first* matters more than which ranks failed: when one rank dies, the others fail too
(a lost peer, a collective that times out, the launcher's SIGTERM). So every failed rank is explained by
the matchers, and ranks are ordered: a cause (an OOM, a NaN, an exception in the user's code, a SIGKILL...)
before an unexplained failure before a rank that timed out waiting before another echo (a lost peer);
causes keep the launcher's order (:func:`mgpucli.run_records.first_failure.collect`: signal deaths,
exceptions, time), echoes are ordered by time.
"""

from __future__ import annotations

import os
import re

from mgpucli.batch_layout import describe as describe_segments
from mgpucli.errors import EXIT_PREEMPTED
from mgpucli.postmortem.checkpoint_peek import read_checkpoint_info
from mgpucli.postmortem.context import (
    job_nodes,
    launcher_alive,
    nodes_disagree,
    resume_command,
    running_verdict,
    tailor,
)
from mgpucli.postmortem.lines import LogLine
from mgpucli.postmortem.matchers import Match, explain, signal_fix
from mgpucli.postmortem.meeting import meeting_failure
from mgpucli.postmortem.pace import straggler_of
from mgpucli.postmortem.reader import RankRun, RunRecord, rank_runs, read_run, steps_per_epoch
from mgpucli.postmortem.report import Failure, Preemption, Report, fate, verdict
from mgpucli.run_layout import LAUNCH_JSON
from mgpucli.run_records import stacks
from mgpucli.run_records.first_failure import EarlyExit, RankFailure, collect, early_exit
from mgpucli.run_records.launch_record import Attempt
from mgpucli.run_records.script_outcome import never_trained
from mgpucli.run_records.worker_records import FailureRecord

__all__ = ["Failure", "Preemption", "Report", "diagnose_attempt", "diagnose_run", "fate"]

UNKNOWN_LINES = 8
_NOISE = ("FutureWarning", "UserWarning", "DeprecationWarning", "warnings.warn(", "train = DDP(")


# ------------------------------------------------------------------------------------------ one attempt
def _unknown(run: RankRun) -> Match:
    """No signature matched: show the rank's last error lines plainly instead of guessing."""
    shown = _meaningful(run.lines)[-UNKNOWN_LINES:]
    logs = [p for p in (run.files.stderr, run.files.stdout) if p]
    if logs and not any(os.path.exists(p) for p in logs) and not run.left_error:
        return Match("unknown", f"rank {run.rank} failed, and its logs are missing ({logs[0]})", run.rank, [],
                     f"The log files listed in {LAUNCH_JSON} are gone: nothing is left to diagnose this rank from.")
    if not run.left_error and run.exitcode is None:
        # No exception handler ran (no torch error file, no mgpu record): the process was killed outright.
        return Match("killed_by_signal", f"rank {run.rank} died without an error: killed by a signal (the exit "
                     "code was not recorded; most likely SIGKILL, the host's out-of-memory killer)", run.rank,
                     shown[-3:], signal_fix(None), details={"signal": None, "inferred": True})
    if run.record is not None and run.record.type == "SystemExit" and run.error_message is None:
        code = run.record.exit_code if run.record.exit_code is not None else run.exitcode
        return Match("script_exit", f"rank {run.rank} ended itself with exit code {code} (sys.exit, no exception)",
                     run.rank, shown, "The code's own sys.exit(...) stopped this rank; its last lines above say why "
                     f"(the full log is {run.files.stderr or run.files.stdout}). An exit code of 2 usually means the "
                     "command line was refused (argparse).", details={"exit_code": code})
    first = (run.error_message or "").strip().splitlines()
    title = f"rank {run.rank} failed: {first[0]}" if first else f"rank {run.rank} failed (exit code {run.exitcode})"
    return Match("unknown", title, run.rank, shown,
                 "No known failure signature matched. The lines above are this rank's last output; the full log is "
                 f"{run.files.stderr or run.files.stdout}.")


def _meaningful(lines: list[LogLine]) -> list[LogLine]:
    return [line for line in lines if line.text.strip() and not any(n in line.text for n in _NOISE)]


def _tier(match: Match) -> int:
    """0: a cause; 1: unexplained (or a death inferred from silence); 2: a rank that waited in a collective until
    it timed out; 3: another echo of a rank's failure (a lost peer, the launcher's SIGTERM)."""
    if match.signature == "unknown" or match.details.get("inferred"):
        return 1
    if match.cause:
        return 0
    return 2 if match.signature == "collective_timeout" else 3


def _failed_ranks(runs: dict[int, RankRun], collected: list[RankFailure], hint: int | None,
                  exitcodes_known: bool) -> list[int]:
    """Ranks that failed, in the launcher's order (``hint``: the rank launch.json names first)."""
    order = [f.rank for f in collected]
    if hint is not None and hint in runs and hint not in order:
        order.insert(0, hint)
    if not exitcodes_known:  # ranks whose logs show a failure although they left no error file
        order += [r for r, run in runs.items() if r not in order and explain(run.lines) is not None]
    return order


def diagnose_attempt(run: RunRecord, attempt: Attempt, hint: int | None = None) -> list[Failure]:
    """Every failed rank of ``attempt``, the one that failed first at the front."""
    runs = rank_runs(run, attempt)
    last = bool(run.attempts) and attempt.attempt == run.attempts[-1].attempt
    codes = {r: c for r, c in run.exitcodes.items() if c != 0} if last and run.exitcodes else None
    collected = collect(attempt, codes) if codes is not None else collect(attempt)
    ranks = [r for r in _failed_ranks(runs, collected, hint if last else None, codes is not None)
             if not _stopped_gracefully(runs[r])]
    failures = []
    for position, rank in enumerate(ranks):
        r = runs[rank]
        match = explain(r.lines) or _unknown(r)
        if match.rank != rank:  # a matcher may quote an interleaved line of another rank: keep this rank's story
            match.rank = rank
        tier = _tier(match)
        # Causes keep the launcher's order (signal deaths first); echoes are ordered by time: the first rank to
        # time out or to lose its peer is closest to the cause.
        when = (r.time if r.time is not None else float("inf")) if tier >= 2 else 0.0
        failures.append(((tier, when, position), Failure(rank, r.local_rank, attempt.attempt, match, time=r.time,
                                                         exitcode=r.exitcode)))
    ordered = [f for _, f in sorted(failures, key=lambda t: t[0])]
    _explain_timeouts(ordered, runs)
    left = early_exit(attempt, collected)
    if left is not None and ordered and not ordered[0].match.cause:
        ordered.insert(0, _left_early(left, runs[left.rank], attempt))
    for failure in ordered:
        tailor(failure.match, run, runs[failure.rank].lines if failure.rank in runs else ())
    steps_in_epoch = steps_per_epoch(runs)
    for failure in ordered:
        _when(failure, runs[failure.rank].record if failure.rank is not None else None, run, steps_in_epoch)
    return ordered


def _left_early(left: EarlyExit, run: RankRun, attempt: Attempt) -> Failure:
    """A rank that ended with exit code 0 while the others still waited for it: the cause of their lost connection."""
    shown = [line for line in _meaningful(run.lines) if line.line is not None][-3:]
    match = Match("left_early", left.describe(), left.rank, shown,
                  f"Rank {left.rank} ended while the others still needed it, so they lost their connection to it. "
                  "Every rank must make the same collective calls in the same order and leave together: look for "
                  f"what let rank {left.rank} finish early (a return, sys.exit or os._exit on one rank; fewer batches "
                  "than the others), and end every rank with dist.barrier() before dist.destroy_process_group().",
                  details={"exit_code": 0, "waiting_rank": left.waiting_rank, "waiting_in": left.waiting_in,
                           "waiting_at": left.waiting_at})
    return Failure(left.rank, run.local_rank, attempt.attempt, match, time=left.time, exitcode=0)


def _stopped_gracefully(run: RankRun) -> bool:
    """The rank stopped on a signal at the step every rank agreed on, after the checkpoint was saved (exit code
    75, Preempted): not a failure, whatever else happened to the job."""
    return run.exitcode == EXIT_PREEMPTED or (run.record is not None and run.record.exit_code == EXIT_PREEMPTED)


def _explain_timeouts(ordered: list[Failure], runs: dict[int, RankRun]) -> None:
    """A collective timeout: name the late ranks (those not waiting), and let it explain their deaths.

    A late rank killed by a signal was either killed first (the others then waited for it) or killed by the
    launcher's teardown after its grace period; both are the timeout's story, told with the late rank's fate.
    """
    timeouts = [f for f in ordered if f.match.signature == "collective_timeout"]
    if not timeouts:
        return
    main = timeouts[0].match
    waiting = sorted({f.rank for f in timeouts} | set(main.details.get("waiting_ranks", [])))
    late = main.details.get("late_ranks") or [r for r in sorted(runs) if r not in waiting]
    main.details["waiting_ranks"] = waiting
    main.details["late_ranks"] = late
    fates = {str(f.rank): fate(f.match) for f in ordered if f.rank in late}
    if fates:
        main.details["late_rank_fates"] = fates
    if late:
        steps = main.details.get("rank_steps") or {}  # a script's mgpucli.progress
        ranks = ", ".join(str(r) + (f" (at step {steps[str(r)]})" if str(r) in steps else "") for r in late)
        main.title += f"; rank{'s' if len(late) > 1 else ''} {ranks} never arrived"
        explained = {f.rank: f.match for f in ordered}
        for rank in late[:2]:  # what the late rank said, else the last line of its own log
            tail = [line for line in _meaningful(runs[rank].lines) if line.line is not None]
            said = [e for e in (explained[rank].evidence if rank in explained else []) if e.line is not None]
            main.evidence += said[:1] or tail[-1:]
    if any(f.match.signature == "killed_by_signal" for f in ordered if f.rank in late):
        main.fix += (" A late rank was killed by a signal: if it was SIGKILL before the timeout, the host's "
                     "out-of-memory killer is the likely cause (`dmesg -T | grep -i 'killed process'`).")
    first = ordered[0]
    if first.match.signature == "killed_by_signal" and first.rank in late and first.match.details.get("signal") \
            in (None, "SIGKILL", "SIGTERM"):
        ordered.remove(timeouts[0])
        ordered.insert(0, timeouts[0])


def _when(failure: Failure, record: FailureRecord | None, run: RunRecord, steps_in_epoch: int | None) -> None:
    """The step (and epoch) of the failure: the message's own step (a NaN is detected steps after it happened:
    the message names the step it happened at), the worker's record, or the last metrics."""
    if failure.match.step is not None:
        failure.step, failure.step_source = failure.match.step, "log message"
    elif record is not None and record.step is not None:
        failure.step, failure.step_source = record.step, "failure record"
    else:
        train = run.last_metrics("train")
        if train is not None and isinstance(train.get("step"), int):
            failure.step, failure.step_source = train["step"], "last logged metrics"
    failure.epoch = _epoch(failure.step, run, steps_in_epoch)


def _epoch(step: int | None, run: RunRecord, steps_in_epoch: int | None) -> int | None:
    """The epoch ``step`` belongs to (rank 0's "N steps per epoch"), else the last logged one."""
    if step is not None and steps_in_epoch:
        return max(0, (step - 1) // steps_in_epoch) + 1  # numbered from 1, as in metrics.jsonl
    train = run.last_metrics("train")
    return train.get("epoch") if train else None


# ------------------------------------------------------------------------------------------ the run
def diagnose_run(run_dir: str) -> Report:
    """Read ``run_dir`` and diagnose it (UsageError, exit 2, when it is not a run directory)."""
    run = read_run(run_dir)
    result = run.result
    status = str(result.get("status") or "unknown")
    launch = run.launch
    devices = launch.get("devices") or {}
    nproc = devices.get("nproc_per_node")
    world = nproc * int(launch.get("nnodes") or 1) if isinstance(nproc, int) else None
    report = Report(run_dir=run.run_dir, status=status, finished=status == "succeeded", verdict="",
                    attempts=len(run.attempts), world_size=world, last_train=run.last_metrics("train"),
                    last_val=run.last_metrics("val"), checkpoint=run.checkpoint, launch_json=run.launch_paths[0],
                    trackers=run.trackers, audit=run.audit,
                    logs=run.attempts[-1].dir if run.attempts else launch.get("log_dir"))
    unfinished = status != "succeeded"  # a finished run has nothing to resume
    report.resume_command = resume_command(launch) if run.checkpoint and not run.is_script and unfinished else None
    report.segments = _segments(run.checkpoint)
    report.membership = [str(a["membership"]["said"]) for a in launch.get("attempts") or [] if isinstance(a, dict)
                         and isinstance(a.get("membership"), dict) and a["membership"].get("said")]
    report.nodes = job_nodes(run)
    report.straggler = straggler_of(run)
    idle = never_trained(run.attempts[-1]) if run.is_script and status == "succeeded" and run.attempts else None
    report.never_trained = idle.describe() if idle is not None else None
    if status == "running" and launcher_alive(launch):
        report.verdict = running_verdict(run)
        return report
    if status == "running":
        report.status = status = "launcher_gone"
    hint = result.get("first_failed_rank")
    for attempt in run.attempts[:-1]:
        found = diagnose_attempt(run, attempt)
        if found:
            report.earlier_attempts.append(found[0])
    meeting = meeting_failure(run)  # several nodes: the launch ended while they met (no worker ran then)
    if meeting is not None:
        report.first_failure = meeting
        report.verdict = verdict(report, run, status)
        return report
    if run.attempts and status != "succeeded":
        found = diagnose_attempt(run, run.attempts[-1], hint if isinstance(hint, int) else None)
        if found:
            report.first_failure, report.others = found[0], found[1:]
    disagree = nodes_disagree(run) if status != "succeeded" else None
    if disagree is not None:
        first = report.first_failure
        if first is None or _tier(first.match) > 0 or first.match.signature == "ranks_disagree":
            if first is not None:
                report.others.insert(0, first)
            report.first_failure = Failure(None, None, run.attempts[-1].attempt if run.attempts else 0, disagree)
    if status == "preempted":
        report.preemption = _preemption(run)
        if report.first_failure is not None and not report.first_failure.match.cause:
            report.others.insert(0, report.first_failure)  # an echo of the stop (a lost peer), not a failure
            report.first_failure = None
    elif status == "stopped" and (report.first_failure is None or not report.first_failure.match.cause):
        report.first_failure = _stopped(run)
    if status == "stalled" and run.attempts:
        report.first_failure = _stalled(run)
        report.stacks = stacks.dumps_of({rank: stacks.stacks_path(files.error_file) for rank, files in
                                         run.attempts[-1].ranks.items() if files.error_file})
    elif report.first_failure is not None and run.attempts:
        report.stacks = _stacks_at_failure(run.attempts[-1], report.first_failure)
    report.verdict = verdict(report, run, status)
    return report


def _stacks_at_failure(attempt: Attempt, first: Failure) -> dict:
    """The other ranks' stacks, asked for by the failing rank before teardown (run_records/stacks.py)."""
    since = first.time - 60 if first.time is not None else None
    return stacks.dumps_of({rank: stacks.stacks_path(files.error_file) for rank, files in attempt.ranks.items()
                            if files.error_file and rank != first.rank}, since=since)


_STALL_FIX = ("The stacks below show where each rank was: the stalled rank's innermost frame of your code is where it "
              "was stuck (a read that never answers, a lock, a rank that took another branch).")
_STALL_FIXES = {  # by who held the others up (mgpucli.launch.hang_verdict)
    "never_joined": "Every rank must reach init_process_group; the rank named never did, and its line below is where "
                    "it was instead (a read or a download that never ends, a lock, a branch only some ranks take).",
    "outside_collective": "Every rank must make the same collectives in the same order; the rank named was "
                          "elsewhere, at its line below (stuck there, or on a path that skips the collective: a "
                          "branch on the rank, fewer batches than the others).",
    "different_collectives": "The ranks made different collective calls, so each waits for a partner that never "
                             "comes: usually uneven data (a different number of batches per rank: "
                             "DistributedSampler(..., drop_last=True), the same number of steps on every rank) or a "
                             "collective inside a branch on the rank. Each rank's line is below.",
}


def _stalled(run: RunRecord) -> Failure:
    """mgpu launch stopped the job: a rank made no progress for trainer.stall_s / --stall-s seconds."""
    stall = run.result.get("stall") or {}
    rank = stall.get("rank")
    title = stall.get("summary") or (f"rank {rank} made no progress for {stall.get('seconds')} s "
                                      f"(stall_s={stall.get('stall_s')}): still at step {stall.get('step')} in "
                                      f"'{stall.get('phase')}'")
    fix = _STALL_FIXES.get(str(stall.get("kind")), _STALL_FIX)
    limit = "--stall-s" if run.is_script else "trainer.stall_s"
    fix += f" If it was legitimately busy there (a long validation or save), raise {limit}."
    match = Match("stalled", title, rank, [], fix, details=stall)
    return Failure(rank, None, run.attempts[-1].attempt, match, step=stall.get("step"), step_source="heartbeat")


def _stopped(run: RunRecord) -> Failure:
    """The launcher was stopped from outside (Ctrl-C, a scheduler) before every rank had stopped gracefully."""
    result = run.result
    sig = result.get("signal") or "a signal"
    attempt = run.attempts[-1].attempt if run.attempts else 0
    hang = f"; {result['hang']}" if result.get("hang") else ""
    match = Match("stopped", f"the launcher was stopped by {sig}{hang}", None, [], signal_fix(str(sig)), cause=False)
    tailor(match, run)
    failure = Failure(None, None, attempt, match)
    if isinstance(result.get("step"), int):
        failure.step, failure.step_source = result["step"], "failure record"
    else:
        _when(failure, None, run, None)
    return failure


def _segments(checkpoint: str | None) -> str | None:
    """On how many processes each segment of the run trained, as its checkpoint records it (read without torch)."""
    info = read_checkpoint_info(checkpoint) if checkpoint else None
    return describe_segments(info.segments, info.step) if info is not None and info.segments else None


_STOPPED_BY = re.compile(r"\bstopped by (SIG[A-Z0-9]+)\b")


def _preemption(run: RunRecord) -> Preemption:
    """Every rank stopped on a signal at one agreed step and saved: which signal, which step, and whether the
    checkpoint that step went into is complete (read without torch)."""
    result = run.result
    runs = rank_runs(run, run.attempts[-1]) if run.attempts else {}
    records = [r.record for _, r in sorted(runs.items()) if r.record is not None
               and r.record.exit_code == EXIT_PREEMPTED]
    signal, signalled = result.get("signal"), None
    if not signal:  # the launcher got no signal: a worker was sent one directly (its record names it)
        for record in records:
            found = record.signal or (m[1] if (m := _STOPPED_BY.search(record.message)) else None)
            if found:
                signal, signalled = found, record.rank
                break
    info = read_checkpoint_info(run.checkpoint) if run.checkpoint else None
    recorded = result.get("step") if isinstance(result.get("step"), int) else None
    train = run.last_metrics("train")
    if info is not None:
        step, source = info.step, "checkpoint"
    elif recorded is not None:
        step, source = recorded, "launch record"
    elif any(record.step is not None for record in records):
        step, source = max(record.step for record in records if record.step is not None), "failure record"
    elif train is not None and isinstance(train.get("step"), int):
        step, source = train["step"], "last logged metrics"
    else:
        step, source = None, None
    return Preemption(signal=str(signal) if signal else None, signalled_rank=signalled, step=step,
                      step_source=source, epoch=_epoch(step, run, steps_per_epoch(runs) if runs else None),
                      checkpoint_step=info.step if info is not None else None, recorded_step=recorded)


