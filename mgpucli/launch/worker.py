"""What every ``mgpu launch`` worker runs: ``python -m mgpucli.launch.worker JOB ARGS...``.

The job (:func:`parse_job`):

- ``train RECIPE [overrides] [--resume PATH|auto] [--overwrite]``: train the recipe as this process's rank, as
  ``mgpu train`` does (:func:`mgpucli.engine.train_entry.train_recipe`), but without mgpu's CLI (no typer, no
  rich). Rank 0 reports in plain lines, and keeps the progress file a launcher on a terminal draws its bar from
  (:mod:`mgpucli.launch.progress_file`).
- ``script [--local-rank-flag FLAG] (PATH | -m MODULE) [ARGS...]``: run the user's own script as ``python``
  would (:mod:`mgpucli.launch.script_job`).

Around any job, the worker adds what only a launched worker needs:

1. a watch on the launcher's pid, so the worker dies with the launcher even if that is SIGKILLed;
2. every process the job starts stays the worker's (a child subreaper: a double-forked daemon or the orphans of a
   helper in a session of its own come back to it) and is ended when the worker ends, however it ends
   (:func:`keep_descendants`);
3. on a torchelastic restart, the job's own restart rule (for a recipe: ``--resume auto`` and no ``--overwrite``,
   see :mod:`mgpucli.launch.restart`);
4. on failure, ``mgpu_failure.json`` next to torch's ``@record`` error file: the exception type, message, step
   and whether a retry can help, so the launcher can stop retrying a failure that repeats.

A job is an object with ``for_restart()`` and ``run()``, registered in :data:`JOBS`.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import signal
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Protocol

from mgpucli import proctree
from mgpucli.errors import EXIT_PREEMPTED, EXIT_USAGE, Preempted, UsageError
from mgpucli.heap import freeze_for_exit, postpone_full_gc, steady_heap
from mgpucli.launch import gate, parent_watch, progress_file, restart, teardown
from mgpucli.launch.script_job import USAGE as SCRIPT_USAGE
from mgpucli.launch.script_job import ScriptJob
from mgpucli.run_records import stacks
from mgpucli.run_records.worker_records import (
    ERROR_FILE_ENV,
    FailureRecord,
    failure_step,
    is_retryable,
    record_path,
    write_record,
)


class Job(Protocol):
    def for_restart(self, environ: Mapping[str, str] | None = None) -> Job:
        """The job as a restart of the worker group runs it (``TORCHELASTIC_RESTART_COUNT`` > 0)."""
        ...

    def run(self) -> None: ...


@dataclass(frozen=True)
class RecipeJob:
    """``train RECIPE [overrides] [--resume PATH|auto] [--overwrite]``: what ``mgpu launch`` passes for a recipe."""

    recipe: str
    overrides: tuple[str, ...] = ()
    resume: str | None = None
    overwrite: bool = False
    probe_steps: int | None = None  # the fit probe instead of training (mgpu launch --probe)
    probe_result: str | None = None  # where rank 0 writes the probe's report

    @classmethod
    def parse(cls, args: Sequence[str]) -> RecipeJob:
        """The job from the arguments after ``train``; UsageError for anything ``mgpu launch`` does not pass."""
        if not args or args[0].startswith("-"):
            raise _usage("train needs a recipe first")
        overrides: list[str] = []
        resume, overwrite = None, False
        probe: dict[str, str | int] = {}
        rest = iter(args[1:])
        for token in rest:
            if token == "--resume":
                resume = next(rest, None)
                if resume is None:
                    raise _usage("--resume needs a value (a checkpoint, or auto)")
            elif token.startswith("--resume="):
                resume = token.split("=", 1)[1]
            elif token == "--overwrite":
                overwrite = True
            elif token == "--probe":
                probe["steps"] = probe.get("steps", 20)
            elif token in ("--probe-steps", "--probe-result"):
                value = next(rest, None)
                if value is None:
                    raise _usage(f"{token} needs a value")
                probe["steps" if token == "--probe-steps" else "result"] = value
            elif token.startswith("-"):
                raise _usage(f"unknown option {token}")
            else:
                overrides.append(token)
        if probe and "steps" not in probe:
            raise _usage("--probe-result needs --probe")
        steps = int(probe["steps"]) if probe else None
        return cls(args[0], tuple(overrides), resume, overwrite, steps, probe.get("result"))

    def for_restart(self, environ: Mapping[str, str] | None = None) -> RecipeJob:
        return replace(self, resume=restart.resume_arg_for_restart(self.resume, environ=environ),
                       overwrite=restart.overwrite_for_restart(self.overwrite, environ))

    def run(self) -> None:
        from mgpucli.engine import train_entry

        steady_heap()  # before torch's allocations, and no full collection walks its imports (mgpucli/heap.py)
        postpone_full_gc()
        _import_the_engine()  # while the launcher checks the recipe: then its verdict (mgpucli/launch/gate.py)
        teardown.install()  # torch's agent ending a failed attempt ends this rank at once (mgpucli/launch/teardown.py)
        gate.check_builds_here(self.recipe, list(self.overrides))
        gate.wait_for_verdict()
        if self.probe_steps is not None:
            train_entry.probe_recipe(self.recipe, list(self.overrides), steps=self.probe_steps,
                                     result_file=self.probe_result, rank0_reporter=rank0_reporter)
            return
        train_entry.train_recipe(self.recipe, list(self.overrides), resume=self.resume, overwrite=self.overwrite,
                                 rank0_reporter=rank0_reporter)


def _import_the_engine() -> None:
    """Import what training needs before the launcher's verdict (nothing here writes anything): torch, the engine,
    and what torch's optimizers import at their first parameter group (its dynamo; a throwaway optimizer on a
    stand-in tensor, through public API only)."""
    import torch

    import mgpucli.engine.run  # noqa: F401
    import mgpucli.engine.trainer  # noqa: F401

    torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=0.1)


JOBS: dict[str, Callable[[Sequence[str]], Job]] = {"train": RecipeJob.parse, "script": ScriptJob.parse}
USAGE = ("train RECIPE [overrides] [--resume PATH|auto] [--overwrite] [--probe [--probe-steps N] [--probe-result "
         f"FILE]], or {SCRIPT_USAGE}")


def _usage(problem: str) -> UsageError:
    return UsageError(f"python -m mgpucli.launch.worker: {problem}.",
                      f"A launched worker runs what mgpu launch passes it: {USAGE}. To train by hand, run "
                      "`mgpu train` (alone or under torchrun) or `mgpu launch`.")


def parse_job(args: Sequence[str]) -> Job:
    """The job these worker arguments name; UsageError (exit 2) for anything else."""
    if not args or args[0] not in JOBS:
        raise _usage(f"unknown job {args[0]!r}" if args else "no job given")
    return JOBS[args[0]](args[1:])


def rank0_reporter():
    """Rank 0's report in a launched worker: plain lines (its output goes to files), plus the progress file when
    the launcher draws a progress bar from one."""
    from mgpucli.engine.line_reporter import LineReporter

    path = os.environ.get(progress_file.ENV)
    return progress_file.ProgressFileReporter(LineReporter(), path) if path else LineReporter()


def _exit_code(exc: BaseException) -> int | None:
    if isinstance(exc, SystemExit):
        code = exc.code
        return code if isinstance(code, int) else (0 if code is None else 1)
    return 1


def _record_failure(exc: BaseException) -> None:
    """Write ``mgpu_failure.json`` beside torch's error file (only under torchrun, where that path is set)."""
    error_file = os.environ.get(ERROR_FILE_ENV)
    if not error_file:
        return
    code = _exit_code(exc)
    # The job turns an MgpuError into sys.exit(code) inside its except block: the error is the context.
    cause = exc.__context__ if isinstance(exc, SystemExit) and exc.__context__ is not None else exc
    from mgpucli.distributed.env import read_rank_env

    try:
        env = read_rank_env()
        rank, local_rank = env.rank, env.local_rank
    except Exception:
        rank = local_rank = -1
    record = FailureRecord(
        rank=rank,
        local_rank=local_rank,
        attempt=restart.restart_count(),
        time=time.time(),
        type=type(cause).__name__,
        message=str(cause).splitlines()[0] if str(cause) else type(cause).__name__,
        step=failure_step(cause),
        exit_code=code,
        retryable=is_retryable(cause, code),
        signal=getattr(cause, "signal", None) if isinstance(cause, Preempted) else None,
    )
    with contextlib.suppress(OSError):  # the log dir is gone: the launcher falls back to torch's error file
        write_record(record_path(error_file), record)


def _exit_through_signals() -> None:
    """After a finished job, a graceful stop (checkpoint saved, record written) or a refusal (bad input, said and
    recorded) only the interpreter's exit is left, and it takes a second or more. torch's agent sends SIGTERM to every
    rank still running the moment the first one exits (and forwards a signal the launcher got); a rank killed by it
    there would turn this exit 0, 75 or 2 into a death by SIGTERM, and the launcher would report a job that
    finished, was preempted, or a recipe every rank refused, as a crash.
    So SIGTERM and SIGINT are ignored from here on: the agent's grace period and a second Ctrl-C at the launcher
    end in SIGKILL, which still works."""
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, signal.SIG_IGN)


def _run(args: list[str]) -> None:
    try:
        job = parse_job(args)
    except UsageError as err:
        from mgpucli.console import print_error

        print_error(str(err))
        sys.exit(err.exit_code)
    job.for_restart().run()


HELPERS_GRACE_S = 2.0  # what a helper of the job gets between SIGTERM and SIGKILL when its worker ends


def keep_descendants() -> None:
    """Nothing the job starts outlives it, whatever session or group it puts itself in: the worker becomes a child
    subreaper (orphans below it come back to it instead of pid 1), and when the interpreter exits (the job's end, a
    failure, Ctrl-C) every process below it that left its process group (a helper in a session of its own, a
    daemon) gets a SIGTERM, :data:`HELPERS_GRACE_S` and a SIGKILL. What is still in the worker's group is left to
    end with it: Python's own helpers (multiprocessing's resource tracker ignores SIGTERM and cleans up after the
    worker) and, at the job's end, whatever else the launcher finds below it. Registered before the job runs, the
    exit hook runs after every other one: multiprocessing has joined its children (DataLoader workers) by then. A
    worker killed outright leaves its descendants to the launcher, a subreaper too, which ends them; a launcher
    killed outright leaves them to this worker's launcher watch."""
    proctree.adopt_orphans()
    atexit.register(proctree.end_descendants, HELPERS_GRACE_S, os.getpgrp())


def main(argv: list[str] | None = None) -> None:
    args = list(sys.argv[1:] if argv is None else argv)
    keep_descendants()
    parent_watch.install_parent_watch()
    stacks.install(os.environ.get(ERROR_FILE_ENV))  # SIGUSR2: every thread's stack into stacks.txt
    try:
        _run(args)
    except SystemExit as exc:
        code = _exit_code(exc)
        if code not in (0, None):
            _record_failure(exc)
            if code not in (EXIT_USAGE, EXIT_PREEMPTED):  # a failure: where were the others?
                stacks.request_siblings(os.environ.get(ERROR_FILE_ENV))
        if code in (0, EXIT_PREEMPTED, EXIT_USAGE):
            _exit_through_signals()
            freeze_for_exit()
        raise
    except KeyboardInterrupt:
        raise  # the agent forwarded Ctrl-C: not a failure of this worker
    except BaseException as exc:
        _record_failure(exc)
        stacks.request_siblings(os.environ.get(ERROR_FILE_ENV))
        raise
    _exit_through_signals()
    freeze_for_exit()  # the job is over: its exit need not walk torch's objects (mgpucli/heap.py)


if __name__ == "__main__":
    main()
