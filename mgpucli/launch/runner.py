"""Run a :class:`~mgpucli.launch.plan.LaunchPlan` through torch's own launcher engine, in this process.

torchrun's own parser and config builder (``torch.distributed.run``'s, through :mod:`mgpucli.torch_parts`) turn
the plan's torchrun arguments into torch's ``LaunchConfig`` exactly as the ``torchrun`` command would, and
``elastic_launch`` runs the elastic agent (rendezvous, worker processes, monitoring, restarts, teardown). mgpu
changes two things in that config:

* the log spec is torch's ``DefaultLogsSpecs`` (same options, same directory layout) with a hook that, at
  the start of every attempt, records rank -> log files in ``launch.json`` and refuses a restart that would
  only repeat the failure before it (see :func:`mgpucli.launch.restart.stop_reason`);
* SIGINT and SIGTERM are handled by mgpu instead of torch: the first one does what torch does (raise
  torch's ``SignalException`` so the agent forwards the signal to the workers and gives them its shutdown
  window), a second one SIGKILLs the workers at once (the first one delivered twice at once, as GNU ``timeout`` does,
  counts once: :mod:`mgpucli.stop_signals`). Other signals (SIGHUP, SIGQUIT, SIGUSR1 under SLURM)
  stay torch's. A signal that comes once every rank has finished (its ``mgpu_finished`` mark: the final
  checkpoint complete) only met the teardown: the run finished, exit 0; one that comes once the outcome is decided
  is ignored.

Beside the agent, :mod:`mgpucli.launch.exit_watch` records when and how each worker ends (the first failure's order,
:mod:`mgpucli.run_records.first_failure`) and ends a failed attempt's workers that outlive a short grace, where the
agent would wait 30 s: its failure teardown takes no shutdown timeout (``LaunchConfig.shutdown_timeout`` is only the
window of a stop the launcher forwards, a preemption, which keeps it).

The agent runs in this process (rather than a ``torchrun`` subprocess) so that the workers are launch's
own children: there is one process to watch for parent death, and torch's failure report (exit codes per
global rank) comes back as a Python exception instead of being parsed from a log.
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
import time
from dataclasses import dataclass, field
from typing import Any

from torch.distributed.elastic.multiprocessing import SignalException
from torch.distributed.elastic.multiprocessing.api import DefaultLogsSpecs, Std
from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
from torch.distributed.launcher.api import elastic_launch

from mgpucli import env_vars, torch_parts
from mgpucli.console import err_console, print_error
from mgpucli.errors import EXIT_FAILED, EXIT_OK, EXIT_PREEMPTED, EXIT_USAGE
from mgpucli.launch import elastic_rounds, hang_verdict, progress_file, rendezvous_watch
from mgpucli.launch.exit_watch import ExitWatch
from mgpucli.launch.failure_summary import summarize
from mgpucli.launch.job_source import PET_PREFIX
from mgpucli.launch.live_view import LiveView
from mgpucli.launch.meeting import NodesProblem
from mgpucli.launch.membership import MembershipWatch
from mgpucli.launch.parent_watch import LAUNCH_PID_ENV
from mgpucli.launch.plan import LaunchPlan
from mgpucli.launch.restart import stop_reason
from mgpucli.launch.stall_watch import BUSY_SHARE, DEFAULT_STALL_S, Stall, StallWatch
from mgpucli.proctree import adopt_orphans, kill_children
from mgpucli.run_files import METRICS, saved_checkpoint
from mgpucli.run_records import stacks
from mgpucli.run_records.first_failure import (
    all_finished,
    all_refused,
    collect,
    failure_records,
    job_exit_code,
    preempted,
    stopped_gracefully,
)
from mgpucli.run_records.launch_record import LaunchRecord, build_attempt, world_size_of
from mgpucli.run_records.script_outcome import never_trained
from mgpucli.stop_signals import FIRST, SAME, SignalCount

_MGPU_SIGNALS = (signal.SIGINT, signal.SIGTERM)
_STILL_S = 5.0  # on Ctrl-C, ranks still for this long are judged hung (who held the others up)
_TORCH_DEFAULT_SIGNALS = "SIGTERM,SIGINT,SIGHUP,SIGQUIT"


class LaunchRefused(Exception):
    """The recipe's check refused the launch (:mod:`mgpucli.launch.gate`): the agent starts no worker (raised where it
    would start them); the check's own error is what the user sees."""


class RestartRefused(Exception):
    """Raised inside the agent, before a restart starts any process, when the failure would repeat."""

    def __init__(self, reason: str, failed_attempt: int):
        super().__init__(reason)
        self.reason = reason
        self.failed_attempt = failed_attempt


class IndexingLogsSpecs(DefaultLogsSpecs):
    """torch's default log layout, plus the launch.json index and the repeat check at every attempt.

    Attempts are this node's starts of its worker group, counted here: torch's own count
    (``TORCHELASTIC_RESTART_COUNT``) leaves out the restarts its agent makes when a node joins an elastic job, and
    would reuse (and empty) the last attempt's log folder. The workers get this count as theirs, and
    ``MGPU_CONTINUES=1`` when their start continues a job that already ran (a restart, or a node that joins the
    running job): they resume from its latest checkpoint (:mod:`mgpucli.launch.restart`). ``elastic_restarts``: an
    elastic job's ``--max-restarts``, counted here for the job's own failures only (a restart on other nodes than
    the round before is the job's membership)."""

    def __init__(self, record: LaunchRecord, gate=None, elastic_restarts: int | None = None, **kwargs):
        super().__init__(**kwargs)
        self._record = record
        self._gate = gate  # the recipe's check still running (mgpucli.launch.gate): the record waits for its go
        self._elastic_restarts = elastic_restarts
        self._failures = 0  # an elastic job's restarts after its own failures
        self.membership = None  # an elastic job's MembershipWatch (mgpucli.launch.membership)
        self.world_size: int | None = None  # the latest attempt's

    def reify(self, envs):
        if self._gate is not None and self._gate.error is not None:
            raise LaunchRefused  # refused while the agent met its rendezvous: no worker starts
        attempt = len(self._record.attempts)
        if attempt > 0:
            self._check_restart(attempt)
        met = rendezvous_watch.last_round()
        continues = "1" if attempt > 0 or (met is not None and met.continues) else "0"
        for env in envs.values():  # each worker's environment, as torch's own log spec sets its error file in it
            env.update({env_vars.RESTART_COUNT: str(attempt), env_vars.CONTINUES: continues})
        dest = super().reify(envs)
        self.world_size = world_size_of(envs)
        started = build_attempt(attempt, envs, dest.stdouts, dest.stderrs, dest.error_files)
        if met is not None:  # the nodes that met for it, and where each keeps its record (mgpu doctor reads them all)
            started.nodes = met.nodes()
        with self._gate.lock if self._gate is not None else contextlib.nullcontext():
            self._record.add_attempt(started)
            if self._gate is None or self._gate.passed:
                self._record.write()
        if attempt > 0 and met is not None and met.changed and self.membership is not None:
            self.membership.changed(attempt, met.labels(met.lost), met.labels(met.joined), len(met.members),
                                    len(envs))
        return dest

    def _check_restart(self, attempt: int) -> None:
        """RestartRefused when the restart that starts attempt ``attempt`` would only repeat the failure before it."""
        if self._elastic_restarts is not None:
            met = rendezvous_watch.last_round()
            if met is not None and met.changed:
                return  # a node lost or joined: the job goes on on the nodes here, which is no failure of its own
            self._failures += 1
            if self._failures > self._elastic_restarts:
                raise RestartRefused(f"its --max-restarts {self._elastic_restarts} are used up (a restart after a node "
                                     "was lost or joined does not count)", attempt - 1)
        reason = stop_reason(self._records(attempt - 1), self._records(attempt - 2))
        if reason:
            raise RestartRefused(reason, attempt - 1)

    def _records(self, number: int):
        found = self._record.attempt(number) if number >= 0 else None
        return failure_records(found) if found is not None else []


class _Signals:
    """First SIGINT/SIGTERM: every rank's stacks, then torch's graceful path. Second (a moment after the first, not the
    first delivered twice: :mod:`mgpucli.stop_signals`): kill the workers now."""

    def __init__(self, record: LaunchRecord, count: SignalCount | None = None):
        self.record = record
        self.count = count or SignalCount()
        self.stacks_asked: float | None = None  # when the first signal asked the ranks for their stacks
        self.received: list[int] = []
        self.active = False  # raise into torch's agent only while it runs; afterwards launch is just finishing

    def install(self) -> None:
        for sig in _MGPU_SIGNALS:
            signal.signal(sig, self._handle)

    @staticmethod
    def ignore_from_now() -> None:
        """The job is over and its outcome decided: a signal now only meets the launcher's own exit (the report, the
        post-mortem), which must not turn a finished job into a Ctrl-C (130) or a death by the signal. Ignored, not
        handled: the interpreter puts a Python handler back to the default as it shuts down, not an ignored signal."""
        for sig in _MGPU_SIGNALS:
            signal.signal(sig, signal.SIG_IGN)

    def _handle(self, signum, frame) -> None:
        counted = self.count.arrived()
        if counted == SAME:
            return  # the first signal, delivered once more (to the launcher and to its process group)
        self.received.append(signum)
        name = signal.Signals(signum).name
        if not self.active:
            kill_children()
            return
        if counted == FIRST:
            err_console().print(
                f"[yellow]mgpu launch: {name} received; stopping the workers gracefully (press Ctrl-C again to "
                "kill them at once).[/]" if not rendezvous_watch.meeting() else
                f"[yellow]mgpu launch: {name} received while the nodes meet; stopping.[/]"
            )
            if self.record.attempts and not rendezvous_watch.meeting():  # where each rank was, before
                # they stop (a hung job's only trace); none runs while the nodes meet
                self.stacks_asked = time.time()
                stacks.request_live([f.error_file for f in self.record.attempts[-1].ranks.values()])
            raise SignalException(f"Process {os.getpid()} got signal: {signum}", sigval=signal.Signals(signum))
        killed = kill_children()
        err_console().print(f"[yellow]mgpu launch: {name} again; killed {len(killed)} worker(s).[/]")


def _signals_for_torch(requested: str) -> str:
    """torch keeps the signals mgpu does not handle itself."""
    names = [s.strip() for s in requested.split(",") if s.strip()]
    return ",".join(n for n in names if n not in ("SIGINT", "SIGTERM")) or "SIGHUP"


@dataclass
class Outcome:
    """How the job ended, for ``launch.json``'s result and the user: recorded and told by :func:`_record`."""

    status: str  # succeeded | failed | stalled | stopped | preempted
    exit_code: int
    message: str
    error: bool = True  # told as an error (print_error), else as a plain line
    details: dict[str, Any] = field(default_factory=dict)


def _record(record: LaunchRecord, outcome: Outcome) -> int:
    """The one place an outcome is recorded in ``launch.json`` and told; returns ``mgpu launch``'s exit code."""
    record.set_result(outcome.status, outcome.exit_code, **outcome.details)
    record.write()
    if outcome.error:
        print_error(outcome.message)
    else:
        err_console().print(outcome.message, markup=False, highlight=False)
    return outcome.exit_code


def _preempted(plan: LaunchPlan, attempt, signal_name: str | None) -> Outcome:
    """Every worker stopped on a signal after saving a checkpoint: exit EXIT_PREEMPTED, for a scheduler to requeue."""
    records = preempted(attempt)
    step = max((r.step for r in records if r.step is not None), default=None)
    where = f" at step {step}" if step is not None else ""
    return Outcome("preempted", EXIT_PREEMPTED, (
        f"mgpu launch: stopped{' by ' + signal_name if signal_name else ' on a signal'}{where}; every rank agreed "
        f"and the checkpoint is complete. Exit code {EXIT_PREEMPTED} (requeue). Continue with the same command "
        f"plus --resume auto. Logs: {plan.log_dir}"), error=False, details={"signal": signal_name, "step": step})


def _finished_in_teardown(plan: LaunchPlan, record: LaunchRecord, signal_name: str, took: float) -> Outcome:
    """The signal came once every rank had finished, the final checkpoint complete: it only met the teardown. The run
    finished: exit 0, recorded as succeeded (with the signal), nothing to resume."""
    return Outcome("succeeded", EXIT_OK, (
        f"mgpu launch: finished; {signal_name} arrived during the teardown, after every rank had finished and the "
        f"final checkpoint was complete. Nothing to resume. "
        + "".join(f"{what}: {path}; " for what, path in _outputs(plan.run_dir)) + f"logs: {plan.log_dir}"),
        error=False, details={"attempts": len(record.attempts), "seconds": round(took, 1), "signal": signal_name})


class _PromoteWhenStarted(threading.Thread):
    """Makes the launch record the run dir's ``launch.json`` as soon as a worker's training starts
    (:meth:`LaunchRecord.promote`), while the job runs: `mgpu doctor RUN_DIR` then reads this run, not the last."""

    def __init__(self, record: LaunchRecord, every_s: float = 0.5):
        super().__init__(name="mgpu-promote-record", daemon=True)
        self._record, self._every_s, self._finished = record, every_s, threading.Event()

    def run(self) -> None:
        while not self._record.promoted and not self._finished.wait(self._every_s):
            if self._record.training_started():
                self._record.promote()

    def finish(self) -> None:
        self._finished.set()
        self.join()
        if not self._record.promoted and self._record.training_started():
            self._record.promote()


def _failure_code(failures: list, script: bool) -> int:
    """``mgpu launch``'s exit code for a failed job: a recipe's is 1, or 2 when every rank refused its input; a
    script's is its own (:func:`mgpucli.run_records.first_failure.job_exit_code`)."""
    if script:
        return job_exit_code(failures)
    return EXIT_USAGE if all_refused(failures) else EXIT_FAILED


def _where_ranks_were(attempt, found: hang_verdict.Verdict | None, since: float | None = None) -> list[str]:
    dumps = stacks.dumps_of({rank: stacks.stacks_path(files.error_file) for rank, files in attempt.ranks.items()
                             if files.error_file}, since=since)
    return ["  where every rank was (their Python stacks, stacks.txt beside their logs):",
            *[f"    {line}" for line in hang_verdict.lines(found, dumps, list(attempt.ranks))]]


def _stalled(found: Stall, watch: StallWatch, attempt, record: LaunchRecord) -> Outcome:
    """A rank stopped making progress: the workers were stopped after their stacks were taken."""
    behind = hang_verdict.verdict(watch.progress)
    summary = found.describe(watch.stall_s) if behind is None else \
        f"{behind.headline}: no progress for {found.seconds:.0f} s (stall_s={watch.stall_s:g})"
    lines = [f"{summary}; the job was stopped.", *_where_ranks_were(attempt, behind),
             f"  all logs: {attempt.dir or '(none)'}; index: {record.path}"]
    if watch.busy_share is not None:
        lines.append(f"  (the default limit, {watch.stall_s:g} s without progress or CPU work; --stall-s N sets "
                     "another, --stall-s 0 turns it off)")
    return Outcome("stalled", EXIT_FAILED, "\n".join(lines), details={
        "stall": {**found.to_json(), "stall_s": watch.stall_s, "summary": summary,
                  "behind": behind.ranks if behind else [found.rank], "kind": behind.kind if behind else None},
        "first_failed_rank": behind.ranks[0] if behind else found.rank, "attempts": len(record.attempts)})


def _interrupted(handler: _Signals, watch: StallWatch | None, record: LaunchRecord) -> tuple[str | None, list[str]]:
    """After a Ctrl-C (or SIGTERM): (who held the others up, when the ranks had been still a while, else None;
    the lines that say where every rank was)."""
    if handler.stacks_asked is None or not record.attempts:
        return None, []
    behind = None
    if watch is not None and watch.frozen_s(time.monotonic()) >= _STILL_S:
        behind = hang_verdict.verdict(watch.progress)
    head = [f"  {behind.headline}"] if behind is not None else []
    lines = head + _where_ranks_were(record.attempts[-1], behind, since=handler.stacks_asked - 1)
    return (behind.headline if behind is not None else None), lines


def _child_failed(plan: LaunchPlan, record: LaunchRecord, err: ChildFailedError, watch: StallWatch | None,
                  total: int) -> Outcome:
    """torch's agent reports failed workers (after its restarts, if any)."""
    script = plan.script is not None
    if not record.attempts:
        return Outcome("failed", EXIT_FAILED, str(err))
    attempt = record.attempts[-1]
    found = collect(attempt, {rank: f.exitcode for rank, f in err.failures.items()})
    if not script and stopped_gracefully(found):
        return _preempted(plan, attempt, None)
    if watch is not None and watch.stall is not None:
        return _stalled(watch.stall, watch, attempt, record)
    return Outcome("failed", _failure_code(found, script), summarize(found, attempt, total, record.path), details={
        "first_failed_rank": found[0].rank if found else None, "attempts": len(record.attempts),
        "exitcodes": {rank: f.exitcode for rank, f in err.failures.items()}})


def _restart_refused(plan: LaunchPlan, record: LaunchRecord, err: RestartRefused, total: int) -> Outcome:
    """A restart would only have repeated the failure before it (:func:`mgpucli.launch.restart.stop_reason`)."""
    script = plan.script is not None
    attempt = record.attempt(err.failed_attempt) or record.attempts[-1]
    if not script and preempted(attempt):
        return _preempted(plan, attempt, None)
    found = collect(attempt)
    return Outcome("failed", job_exit_code(found) if script else EXIT_FAILED,
                   summarize(found, attempt, total, record.path) + f"\n  not restarted: {err.reason}.", details={
                       "first_failed_rank": found[0].rank if found else None, "attempts": len(record.attempts),
                       "restart_refused": err.reason})


def _signalled(plan: LaunchPlan, record: LaunchRecord, err: SignalException, handler: _Signals,
               watch: StallWatch | None, took: float) -> Outcome:
    """The launcher got SIGINT/SIGTERM (see :class:`_Signals`): the workers were stopped through torch's agent."""
    script = plan.script is not None
    sig = int(err.sigval)
    if not script and record.attempts and preempted(record.attempts[-1]):
        return _preempted(plan, record.attempts[-1], signal.Signals(sig).name)
    if not script and record.attempts and all_finished(record.attempts[-1]):
        return _finished_in_teardown(plan, record, signal.Signals(sig).name, took)
    code = 128 + sig
    again = "" if script else "Continue with: mgpu launch ... --resume auto "
    hang, where = _interrupted(handler, watch, record)
    meeting = rendezvous_watch.waiting_now()  # stopped while the nodes met: where that wait stood
    return Outcome("stopped", code, "\n".join([
        f"mgpu launch: stopped by {signal.Signals(sig).name}; the workers have exited. {again}(logs: {plan.log_dir})",
        *where, *([f"  while the nodes met: {meeting[0]}"] if meeting else [])]), error=False,
        details={"signal": signal.Signals(sig).name, "hang": hang, "rendezvous": meeting[1] if meeting else None})


def _succeeded(plan: LaunchPlan, record: LaunchRecord, took: float, world: int | None = None) -> Outcome:
    """``world``: the last attempt's world size (an elastic job's may be fewer than all its nodes')."""
    idle = never_trained(record.attempts[-1]) if plan.script is not None and record.attempts else None
    return Outcome("succeeded", EXIT_OK, (
        f"mgpu launch: {world or plan.nnodes * plan.nproc_per_node} worker(s) finished in {took:.1f} s"
        + (f" after {len(record.attempts) - 1} restart(s)" if len(record.attempts) > 1 else "") + ". "
        + "".join(f"{what}: {path}; " for what, path in _outputs(plan.run_dir))
        + f"logs: {plan.log_dir} (index: {record.path})"
        + (f"\n  note: {idle.describe()}" if idle is not None else "")), error=False,
        details={"attempts": len(record.attempts), "seconds": round(took, 1)})


def _agent_config(plan: LaunchPlan, record: LaunchRecord, live: bool, show_rank: str | None, gate=None):
    """(torch's LaunchConfig, the worker command and its arguments, the attempts allowed, the live view or None):
    the plan's torchrun arguments read by torchrun's own parser, with mgpu's log spec and signals."""
    os.environ.update(plan.env)
    os.environ[LAUNCH_PID_ENV] = str(os.getpid())
    options, job_args = plan.split_at_job()
    args = parse_torchrun_options(options)
    view = None
    if live:
        args.tee = "0"  # the live view shows the lines
        progress = None
        if plan.script is None:  # a recipe's rank 0 keeps a progress file for the bar; a script has lines only
            progress = os.path.join(plan.log_dir, f".progress-{plan.rdzv_id}.json")
            os.environ[progress_file.ENV] = progress
        view = LiveView(record, progress, show=show_rank)
    config, cmd, cmd_args = torch_parts.torchrun_config(args)
    if plan.nnodes > 1:  # the nodes meet with a voice, a deadline and every signal working, then compare their jobs
        config.rdzv_backend = rendezvous_watch.watch_plan(plan, abort=lambda: gate is not None and gate.error is not
                                                          None, last_step=lambda: _last_step(record),
                                                          checkpoint_step=lambda: _checkpoint_step(plan.run_dir))
    cmd_args = [*cmd_args, *job_args]  # untouched by torchrun's parser: they come last, as torchrun puts them
    own_restarts = int(args.max_restarts) - elastic_rounds.NODE_CHANGES if plan.nodes.elastic else None
    config.logs_specs = IndexingLogsSpecs(
        record, gate, own_restarts, log_dir=args.log_dir, redirects=Std.from_str(args.redirects),
        tee=Std.from_str(args.tee)
    )
    config.signals_to_handle = _signals_for_torch(args.signals_to_handle or _TORCH_DEFAULT_SIGNALS)
    return config, cmd, cmd_args, 1 + int(args.max_restarts), view


def parse_torchrun_options(options: list[str]):
    """torchrun's parser on the plan's options alone. It takes every option left out from ``PET_<OPTION>``; the plan
    already read the ones mgpu honours (:mod:`mgpucli.launch.job_source`), and a stray one (``PET_RDZV_ENDPOINT``
    under a static rendezvous, ``PET_STANDALONE``) would change the job behind the plan's back, so the parser
    sees none of them. The workers still inherit them, as under torchrun."""
    hidden = {k: os.environ.pop(k) for k in [k for k in os.environ if k.startswith(PET_PREFIX)]}
    try:
        return torch_parts.torchrun_options(options)
    finally:
        os.environ.update(hidden)


class _Watchers:
    """The threads that run beside torch's agent: the record's promotion, the workers' exits, the live view, the stall
    watch and the audit's findings."""

    def __init__(self, plan: LaunchPlan, record: LaunchRecord, view: LiveView | None, stall_s: float | None,
                 handler: _Signals):
        self.promoter = _PromoteWhenStarted(record)
        self.promoter.start()
        self.exits = ExitWatch(record, stopping=lambda: bool(handler.received))
        self.exits.start()
        self.view = view
        if view is not None:
            view.start()
        self.stall = _stall_watch(record, stall_s)
        if self.stall is not None:
            self.stall.start()
        self.audit = _audit_watch(plan, record)
        self.membership = None
        if plan.nodes.elastic:  # each change of the nodes said and recorded (mgpucli.launch.membership)
            self.membership = MembershipWatch(record, _say)
            self.membership.start()

    def finish(self, plan: LaunchPlan) -> None:
        self.promoter.finish()
        if self.membership is not None:
            self.membership.finish()
        self.exits.finish()
        if self.stall is not None:
            self.stall.finish()
        if self.view is not None:
            self.view.finish()
            with contextlib.suppress(OSError, KeyError):
                os.unlink(os.environ.pop(progress_file.ENV))
        if self.audit is not None:
            _finish_audit(self.audit, plan)



def run_plan(plan: LaunchPlan, record: LaunchRecord, live: bool = False, show_rank: str | None = None,
             stall_s: float | None = None, gate=None) -> int:
    """Start the job, wait for it, report; returns the exit code for ``mgpu launch``. ``live``: this process shows
    rank 0's output (or ``show_rank``'s: a local rank, or "all") itself, under a progress bar for a recipe (a
    terminal: :mod:`mgpucli.launch.live_view`) instead of torch's ``--tee``. ``gate``: the recipe's check, started
    with the agent (:mod:`mgpucli.launch.gate`); its refusal is raised here once the workers are gone, and what the
    launch created removed."""
    config, cmd, cmd_args, total, view = _agent_config(plan, record, live, show_rank, gate)
    adopt_orphans()  # what a worker killed outright leaves comes back here, and the safety net below ends it
    record.set_env(os.environ, plan.env)
    if gate is None:
        record.write()
    handler = _Signals(record)
    handler.install()
    watchers = _Watchers(plan, record, view, stall_s, handler)
    config.logs_specs.membership = watchers.membership
    start = time.monotonic()
    try:
        handler.active = True
        try:
            if gate is not None:
                gate.start()
                if gate.error is not None:
                    raise LaunchRefused  # refused before the agent started: nothing to start
            elastic_launch(config, cmd)(*cmd_args)
        finally:
            handler.active = False
            watchers.finish(plan)
        outcome = _succeeded(plan, record, time.monotonic() - start, config.logs_specs.world_size)
    except ChildFailedError as err:
        outcome = _child_failed(plan, record, err, watchers.stall, total)
    except LaunchRefused:
        outcome = None  # the check's own error is raised below
    except RestartRefused as err:
        outcome = _restart_refused(plan, record, err, total)
    except SignalException as err:
        outcome = _signalled(plan, record, err, handler, watchers.stall, time.monotonic() - start)
    except NodesProblem as err:  # the nodes never met (or a lost one never came back), or met and differ
        outcome = Outcome(err.status, err.exit_code, str(err), details={"rendezvous": err.details})
    finally:
        left = kill_children()  # a safety net: torch's agent has stopped its workers on every path above
        if gate is not None:
            gate.abandon()
        refusal = gate.refused() if gate is not None else None
        if left and refusal is None:
            err_console().print(f"[yellow]mgpu launch: killed {len(left)} process(es) of the job still running at "
                                "exit.[/]")
        handler.ignore_from_now()
        if refusal is not None:
            gate.remove_created()
            raise refusal
        record.write()
    return _record(record, outcome)


def _audit_watch(plan: LaunchPlan, record: LaunchRecord):
    """``--audit``: the thread that shows the workers' findings as they come (None without it)."""
    if plan.script is None or not plan.script.audit:
        return None
    from mgpucli.launch.audit_view import AuditWatch

    watch = AuditWatch(record)
    watch.start()
    return watch


def _finish_audit(watch, plan: LaunchPlan) -> None:
    """The audit's summary and ``audit.json``; a problem there never changes the job's result."""
    try:
        watch.finish(plan.rdzv_id)
    except Exception as err:  # noqa: BLE001
        err_console().print(f"mgpu launch: the audit's summary failed ({type(err).__name__}: {err}); the findings are "
                            f"in each rank's mgpu_audit.jsonl under {plan.log_dir}.", markup=False, highlight=False)


def _outputs(run_dir: str) -> list[tuple[str, str]]:
    """What the run left for the user, where it exists on this node: its latest checkpoint and its metrics."""
    last = saved_checkpoint(run_dir)
    found = [("checkpoint", str(last))] if last is not None else []
    metrics = os.path.join(run_dir, METRICS)
    return found + ([("metrics", metrics)] if os.path.isfile(metrics) else [])


def _say(line: str) -> None:
    err_console().print(line, markup=False, highlight=False)


def _checkpoint_step(run_dir: str) -> int | None:
    """The step of the run's latest checkpoint on this node (None: none it can read)."""
    from mgpucli.postmortem.checkpoint_peek import read_checkpoint_info

    path = saved_checkpoint(run_dir)
    info = read_checkpoint_info(str(path)) if path is not None else None
    return info.step if info is not None else None


def _last_step(record: LaunchRecord) -> int | None:
    """The step this node's ranks had reached when the last attempt ended (their failure records), if known."""
    steps = [r.step for r in failure_records(record.attempts[-1]) if r.step is not None] if record.attempts else []
    return max(steps, default=None)


def _stall_watch(record: LaunchRecord, stall_s: float | None) -> StallWatch | None:
    """The stall watch: ``stall_s`` given judges progress alone; None is the default limit, where CPU work counts
    as progress too; 0 is none."""
    if stall_s == 0:
        return None
    if stall_s is None:
        return StallWatch(record, DEFAULT_STALL_S, kill_children, busy_share=BUSY_SHARE)
    return StallWatch(record, stall_s, kill_children)
