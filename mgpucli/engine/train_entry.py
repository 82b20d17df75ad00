"""A training process's entry, shared by ``mgpu train`` and every ``mgpu launch`` worker.

:func:`mgpucli.engine.run.run_training` trains; around it, :func:`train_recipe` adds what belongs to the process:

- the C heap and the garbage collector set up for training (:mod:`mgpucli.heap`);
- torch's ``@record``: an unexpected exception's traceback goes to the error file torch's agent reports;
- the worker's marks that training started and that the run finished
  (:func:`mgpucli.run_records.worker_records.mark_started`, :func:`~mgpucli.run_records.worker_records.mark_finished`);
- errors printed by the right rank (:func:`run_as_rank`): bad input is the same on every rank, so rank 0 alone
  says it; a failure names its rank; a graceful stop on a signal is a plain note from rank 0, not an error;
- exit codes: an MgpuError's own (1 failed, 2 bad input, 75 preempted); anything else keeps its traceback.

It imports neither typer nor rich (rich only to print an error on a terminal): a launched worker, whose output
goes to files, needs neither.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

from mgpucli import env_vars
from mgpucli.console import print_error
from mgpucli.distributed.env import RankEnv, read_rank_env
from mgpucli.engine.line_reporter import LineReporter
from mgpucli.engine.reporter import Reporter
from mgpucli.errors import MgpuError, Preempted
from mgpucli.heap import postpone_full_gc, resume_full_gc, steady_heap

T = TypeVar("T")


def run_as_rank(body: Callable[[RankEnv], None]) -> None:
    """Run ``body`` with this process's rank (one worker of a job when RANK/WORLD_SIZE are set); an MgpuError it
    raises is printed as a job prints it and ends the process with its exit code."""
    rank = None
    try:
        env = read_rank_env()
        rank = env.rank if env.distributed else None
        body(env)
    except Preempted as err:
        # A graceful stop, not an error: every rank agreed on it, so rank 0 alone says it, as a plain note.
        if rank in (None, 0):
            print(f"mgpu train: {err}", file=sys.stderr, flush=True)
        sys.exit(err.exit_code)
    except MgpuError as err:
        # Bad input is the same on every rank: rank 0 alone says it, but for mgpu launch, which keeps each rank's
        # output in a log of its own, every rank does. The rank that refused first may be the only one to say it
        # before torch's teardown stops the others, and the launcher's summary shows that rank's log.
        # A failure names its rank.
        if rank in (None, 0) or not err.same_on_every_rank or env_vars.LAUNCH_PID in os.environ:
            print_error(str(err), rank=rank)
        sys.exit(err.exit_code)
    except Exception:
        if rank is not None:
            print_error("failed with an unexpected error (traceback below).", rank=rank)
        raise


def train_recipe(recipe: str, overrides: list[str], *, resume: str | None = None, overwrite: bool = False,
                 rank0_reporter: Callable[[], Reporter] = LineReporter) -> None:
    """Train from a recipe on this process. Rank 0 reports through ``rank0_reporter()`` (plain lines by default);
    the other ranks report nothing."""
    steady_heap()  # before the first large allocation: see mgpucli/heap.py
    postpone_full_gc()
    try:
        run_as_rank(lambda env: _train(recipe, overrides, resume, overwrite, env, rank0_reporter))
    finally:
        resume_full_gc()  # if it failed before the end of set-up (settle_gc): full collections as usual


def _train(recipe: str, overrides: list[str], resume: str | None, overwrite: bool, env: RankEnv,
           rank0_reporter: Callable[[], Reporter]) -> None:
    """Train, under :func:`_recorded`."""
    from mgpucli.engine.run import composed, run_training
    from mgpucli.run_records.worker_records import mark_finished, mark_started

    recipe_cfg = composed(recipe, overrides)  # bad input is refused before torch is imported
    reporter = rank0_reporter() if env.rank == 0 else None
    _recorded(lambda: run_training(recipe, overrides, resume=resume, overwrite=overwrite, env=env, reporter=reporter,
                                   started=mark_started, finished=mark_finished, recipe_cfg=recipe_cfg))


def _recorded(body: Callable[[], T]) -> T:
    """``body()``. Unexpected exceptions go through torch's @record, which writes the error file (with the
    traceback) that torch's agent reports; an MgpuError is a message for the user, raised past it without one."""
    from torch.distributed.elastic.multiprocessing.errors import record

    returned: list[T] = []

    def guarded() -> MgpuError | None:
        try:
            returned.append(body())
        except MgpuError as err:
            return err
        return None

    err = record(guarded)()
    if err is not None:
        raise err
    return returned[0]


def probe_recipe(recipe: str, overrides: list[str], *, steps: int, result_file: str | None = None,
                 rank0_reporter: Callable[[], Reporter] = LineReporter) -> dict | None:
    """The fit probe (engine/probe.py) on this process: measure, write nothing. Rank 0 returns the report (and
    writes it to ``result_file`` when given, for ``mgpu launch`` to render); the other ranks return None."""
    from mgpucli.errors import UsageError

    if steps < 1:
        raise UsageError(f"--probe-steps {steps}: the probe needs at least one step to time.")
    report: dict = {}

    def probe(env: RankEnv) -> None:
        from mgpucli.engine.run import composed, run_probe

        recipe_cfg = composed(recipe, overrides)  # bad input is refused before torch is imported
        reporter = rank0_reporter() if env.rank == 0 else None
        found = _recorded(lambda: run_probe(recipe, overrides, env=env, reporter=reporter, steps=steps,
                                            recipe_cfg=recipe_cfg))
        if found is not None:
            report.update(found)
            if result_file:
                Path(result_file).write_text(json.dumps(found))

    steady_heap()
    postpone_full_gc()
    try:
        run_as_rank(probe)
    finally:
        resume_full_gc()
    return report or None
