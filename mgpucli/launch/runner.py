"""Run a :class:`~mgpucli.launch.plan.LaunchPlan` through torch's own launcher engine, in this process.

``torch.distributed.run.parse_args`` + ``config_from_args`` turn the plan's torchrun arguments into torch's
``LaunchConfig`` exactly as the ``torchrun`` command would, and ``elastic_launch`` runs the elastic agent
(rendezvous, worker processes, monitoring, restarts, teardown). mgpu changes two things in that config:

* the log spec is torch's ``DefaultLogsSpecs`` (same options, same directory layout) with a hook that, at
  the start of every attempt, records rank -> log files in ``launch.json`` and refuses a restart that would
  only repeat the failure before it (see :func:`mgpucli.launch.restart.stop_reason`);
* SIGINT and SIGTERM are handled by mgpu instead of torch: the first one does what torch does (raise
  torch's ``SignalException`` so the agent forwards the signal to the workers and gives them its shutdown
  window), a second one SIGKILLs the workers at once. Other signals (SIGHUP, SIGQUIT, SIGUSR1 under SLURM)
  stay torch's.

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

from torch.distributed import run as torchrun
from torch.distributed.elastic.multiprocessing import SignalException
from torch.distributed.elastic.multiprocessing.api import DefaultLogsSpecs, Std
from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
from torch.distributed.launcher.api import elastic_launch

from mgpucli.console import err_console, print_error
from mgpucli.errors import EXIT_FAILED, EXIT_OK, EXIT_PREEMPTED, EXIT_USAGE
from mgpucli.launch import progress_file
from mgpucli.launch.failure_summary import summarize
from mgpucli.launch.live_view import LiveView
from mgpucli.launch.parent_watch import LAUNCH_PID_ENV
from mgpucli.launch.plan import LaunchPlan
from mgpucli.launch.restart import stop_reason
from mgpucli.launch.stall_watch import Stall, StallWatch
from mgpucli.proctree import adopt_orphans, kill_children
from mgpucli.run_files import METRICS, last_checkpoint
from mgpucli.run_records import stacks
from mgpucli.run_records.first_failure import all_refused, collect, failure_records, job_exit_code, preempted
from mgpucli.run_records.launch_record import LaunchRecord, build_attempt

_MGPU_SIGNALS = (signal.SIGINT, signal.SIGTERM)
_TORCH_DEFAULT_SIGNALS = "SIGTERM,SIGINT,SIGHUP,SIGQUIT"


class RestartRefused(Exception):
    """Raised inside the agent, before a restart starts any process, when the failure would repeat."""

    def __init__(self, reason: str, failed_attempt: int):
        super().__init__(reason)
        self.reason = reason
        self.failed_attempt = failed_attempt


class IndexingLogsSpecs(DefaultLogsSpecs):
    """torch's default log layout, plus the launch.json index and the repeat check at every attempt."""

    def __init__(self, record: LaunchRecord, **kwargs):
        super().__init__(**kwargs)
        self._record = record

    def reify(self, envs):
        first_env = next(iter(envs.values()), {})
        attempt = int(first_env.get("TORCHELASTIC_RESTART_COUNT", "0") or 0)
        if attempt > 0:
            reason = stop_reason(self._records(attempt - 1), self._records(attempt - 2))
            if reason:
                raise RestartRefused(reason, attempt - 1)
        dest = super().reify(envs)
        self._record.add_attempt(build_attempt(attempt, envs, dest.stdouts, dest.stderrs, dest.error_files))
        self._record.write()
        return dest

    def _records(self, number: int):
        found = self._record.attempt(number) if number >= 0 else None
        return failure_records(found) if found is not None else []


class _Signals:
    """First SIGINT/SIGTERM: torch's graceful path. Second: kill the workers now."""

    def __init__(self):
        self.received: list[int] = []
        self.active = False  # raise into torch's agent only while it runs; afterwards launch is just finishing
        self._previous = {}

    def install(self) -> None:
        for sig in _MGPU_SIGNALS:
            self._previous[sig] = signal.signal(sig, self._handle)

    def restore(self) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)

    def _handle(self, signum, frame) -> None:
        self.received.append(signum)
        name = signal.Signals(signum).name
        if not self.active:
            kill_children()
            return
        if len(self.received) == 1:
            err_console().print(
                f"[yellow]mgpu launch: {name} received; stopping the workers gracefully (press Ctrl-C again to "
                "kill them at once).[/]"
            )
            raise SignalException(f"Process {os.getpid()} got signal: {signum}", sigval=signal.Signals(signum))
        killed = kill_children()
        err_console().print(f"[yellow]mgpu launch: {name} again; killed {len(killed)} worker(s).[/]")


def _signals_for_torch(requested: str) -> str:
    """torch keeps the signals mgpu does not handle itself."""
    names = [s.strip() for s in requested.split(",") if s.strip()]
    return ",".join(n for n in names if n not in ("SIGINT", "SIGTERM")) or "SIGHUP"


def _preempted(plan: LaunchPlan, record: LaunchRecord, attempt, signal_name: str | None) -> int:
    """Every worker stopped on a signal after saving a checkpoint: exit EXIT_PREEMPTED, for a scheduler to requeue."""
    records = preempted(attempt)
    step = max((r.step for r in records if r.step is not None), default=None)
    record.set_result("preempted", EXIT_PREEMPTED, signal=signal_name, step=step)
    where = f" at step {step}" if step is not None else ""
    err_console().print(
        f"mgpu launch: stopped{' by ' + signal_name if signal_name else ' on a signal'}{where}; every rank agreed "
        f"and the checkpoint is complete. Exit code {EXIT_PREEMPTED} (requeue). Continue with the same command "
        f"plus --resume auto. Logs: {plan.log_dir}",
        markup=False, highlight=False,
    )
    return EXIT_PREEMPTED


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


def _stalled(found: Stall, stall_s: float, attempt, record: LaunchRecord) -> int:
    """A rank stopped making progress: the workers were stopped after their stacks were taken."""
    record.set_result("stalled", EXIT_FAILED, stall={**found.to_json(), "stall_s": stall_s},
                      first_failed_rank=found.rank, attempts=len(record.attempts))
    dumps = stacks.dumps_of({rank: stacks.stacks_path(files.error_file) for rank, files in attempt.ranks.items()
                             if files.error_file})
    lines = [f"{found.describe(stall_s)}; the job was stopped.",
             "  where every rank was (their Python stacks, stacks.txt beside their logs):",
             *[f"    {stacks.describe(rank, dump)}" for rank, dump in dumps.items()],
             f"  all logs: {attempt.dir or '(none)'}; index: {record.path}"]
    print_error("\n".join(lines))
    return EXIT_FAILED


def run_plan(plan: LaunchPlan, record: LaunchRecord, live: bool = False, show_rank: str | None = None,
             stall_s: float | None = None) -> int:
    """Start the job, wait for it, report; returns the exit code for ``mgpu launch``. ``live``: this process shows
    rank 0's output (or ``show_rank``'s: a local rank, or "all") itself, under a progress bar for a recipe (a
    terminal: :mod:`mgpucli.launch.live_view`) instead of torch's ``--tee``."""
    os.environ.update(plan.env)
    os.environ[LAUNCH_PID_ENV] = str(os.getpid())
    adopt_orphans()  # what a worker killed outright leaves comes back here, and the safety net below ends it
    script = plan.script is not None
    options, job_args = plan.split_at_job()
    args = torchrun.parse_args(options)
    view = None
    if live:
        args.tee = "0"  # the live view shows the lines
        progress = None
        if not script:  # a recipe's rank 0 keeps a progress file for the bar; a script has no bar, lines only
            progress = os.path.join(plan.log_dir, f".progress-{plan.rdzv_id}.json")
            os.environ[progress_file.ENV] = progress
        view = LiveView(record, progress, show=show_rank)
    config, cmd, cmd_args = torchrun.config_from_args(args)
    cmd_args = [*cmd_args, *job_args]  # untouched by torchrun's parser: they come last, as torchrun puts them
    config.logs_specs = IndexingLogsSpecs(
        record, log_dir=args.log_dir, redirects=Std.from_str(args.redirects), tee=Std.from_str(args.tee)
    )
    config.signals_to_handle = _signals_for_torch(args.signals_to_handle or _TORCH_DEFAULT_SIGNALS)
    record.set_env(os.environ, plan.env)
    record.write()
    total = 1 + int(args.max_restarts)
    handler = _Signals()
    handler.install()
    promoter = _PromoteWhenStarted(record)
    promoter.start()
    if view is not None:
        view.start()
    stall = StallWatch(record, stall_s, kill_children) if stall_s else None  # trainer.stall_s / --stall-s
    if stall is not None:
        stall.start()
    audit = _audit_watch(plan, record)
    start = time.monotonic()
    try:
        handler.active = True
        try:
            elastic_launch(config, cmd)(*cmd_args)
        finally:
            handler.active = False
            promoter.finish()
            if stall is not None:
                stall.finish()
            if view is not None:
                view.finish()
                with contextlib.suppress(OSError, KeyError):
                    os.unlink(os.environ.pop(progress_file.ENV))
            if audit is not None:
                _finish_audit(audit, plan)
    except ChildFailedError as err:
        if not script and record.attempts and all(f.exitcode == EXIT_PREEMPTED for f in err.failures.values()):
            return _preempted(plan, record, record.attempts[-1], None)
        if not record.attempts:
            record.set_result("failed", EXIT_FAILED)
            print_error(str(err))
            return EXIT_FAILED
        attempt = record.attempts[-1]
        if stall is not None and stall.stall is not None:
            return _stalled(stall.stall, stall_s, attempt, record)
        found = collect(attempt, {rank: f.exitcode for rank, f in err.failures.items()})
        first = found[0].rank if found else None
        code = _failure_code(found, script)
        record.set_result("failed", code, first_failed_rank=first, attempts=len(record.attempts),
                          exitcodes={str(rank): f.exitcode for rank, f in err.failures.items()})
        print_error(summarize(found, attempt, total, record.path))
        return code
    except RestartRefused as err:
        attempt = record.attempt(err.failed_attempt) or record.attempts[-1]
        if not script and preempted(attempt):
            return _preempted(plan, record, attempt, None)
        found = collect(attempt)
        first = found[0].rank if found else None
        code = job_exit_code(found) if script else EXIT_FAILED
        record.set_result("failed", code, first_failed_rank=first, attempts=len(record.attempts),
                          restart_refused=err.reason)
        print_error(summarize(found, attempt, total, record.path)
                    + f"\n  not restarted: {err.reason}.")
        return code
    except SignalException as err:
        sig = int(err.sigval)
        if not script and record.attempts and preempted(record.attempts[-1]):
            return _preempted(plan, record, record.attempts[-1], signal.Signals(sig).name)
        code = 128 + sig
        record.set_result("stopped", code, signal=signal.Signals(sig).name)
        again = "" if script else "Continue with: mgpu launch ... --resume auto "
        err_console().print(
            f"mgpu launch: stopped by {signal.Signals(sig).name}; the workers have exited. {again}"
            f"(logs: {plan.log_dir})",
            markup=False, highlight=False,
        )
        return code
    finally:
        left = kill_children()  # a safety net: torch's agent has stopped its workers on every path above
        if left:
            err_console().print(f"[yellow]mgpu launch: killed {len(left)} process(es) of the job still running at "
                                "exit.[/]")
        handler.restore()
        record.write()
    took = time.monotonic() - start
    record.set_result("succeeded", EXIT_OK, attempts=len(record.attempts), seconds=round(took, 1))
    record.write()
    err_console().print(
        f"mgpu launch: {plan.nnodes * plan.nproc_per_node} worker(s) finished in {took:.1f} s"
        + (f" after {len(record.attempts) - 1} restart(s)" if len(record.attempts) > 1 else "") + ". "
        + "".join(f"{what}: {path}; " for what, path in _outputs(plan.run_dir))
        + f"logs: {plan.log_dir} (index: {record.path})", markup=False, highlight=False,
    )
    return EXIT_OK


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
    found = [("checkpoint", str(p)) for p in (last_checkpoint(run_dir), last_checkpoint(run_dir, sharded=True))
             if p.exists()]
    metrics = os.path.join(run_dir, METRICS)
    return found + ([("metrics", metrics)] if os.path.isfile(metrics) else [])
