"""What ``mgpu train`` does, without typer: the command line's ``train`` and every ``mgpu launch`` worker call it.

A launched worker calls :func:`run_train` directly (mgpucli.launch.worker), so it imports neither typer nor,
unless rank 0 has a terminal, rich: ~3 MiB of resident memory per rank that the hand-written loop
does not pay (benchmarks/overhead.py).
"""

from __future__ import annotations

import json
import os
import sys
from dataclasses import dataclass
from pathlib import Path

from mgpucli.errors import MgpuError, Preempted


@dataclass(frozen=True)
class ProbeOptions:
    """``mgpu train --probe``: how many steps to time, and where the report goes."""

    steps: int = 20
    as_json: bool = False  # one JSON object on stdout instead of lines on stderr
    result_file: str | None = None  # rank 0 writes the report there and prints nothing (mgpu launch renders it)


def run_train(recipe: str, overrides: list[str], resume: str | None = None, overwrite: bool = False,
              check: bool = False, probe: ProbeOptions | None = None) -> None:
    """Train from a recipe on this process (one worker of a job when RANK/WORLD_SIZE are set); with ``probe``,
    measure instead (engine/probe.py)."""
    from mgpucli.console import print_error
    from mgpucli.distributed.env import read_rank_env
    from mgpucli.heap import postpone_full_gc, resume_full_gc, steady_heap

    if not check:
        steady_heap()  # before the first large allocation: see mgpucli/heap.py
        postpone_full_gc()

    rank = None
    try:
        env = read_rank_env()
        rank = env.rank if env.distributed else None
        if probe is not None:
            _check_probe_options(probe, resume, overwrite, check)
        if check:
            from mgpucli.cli.check import check_and_print
            from mgpucli.run_files import check_start

            check_and_print(recipe, overrides, quiet=rank not in (None, 0),
                            check_run_dir=lambda run_dir, sharded: check_start(run_dir, resume, overwrite, sharded))
            return
        if probe is not None:
            _recorded(lambda: _probe(recipe, overrides, env, probe))
            return
        _recorded(lambda: _train(recipe, overrides, resume, overwrite, env))
    except Preempted as err:
        # A graceful stop, not an error: every rank agreed on it, so rank 0 alone says it, as a plain note.
        if rank in (None, 0):
            print(f"mgpu train: {err}", file=sys.stderr, flush=True)
        sys.exit(err.exit_code)
    except MgpuError as err:
        # Bad input is the same on every rank: let rank 0 alone say it. A failure names its rank.
        if rank in (None, 0) or not err.same_on_every_rank:
            print_error(str(err), rank=rank)
        sys.exit(err.exit_code)
    except Exception:
        if rank is not None:
            print_error("failed with an unexpected error (traceback below).", rank=rank)
        raise
    finally:
        resume_full_gc()  # if it failed before the end of set-up (settle_gc): full collections as usual


def _reporter(rank: int):
    """Rank 0 reports: a rich progress bar on a terminal, plain lines otherwise (log files, CI, and every
    ``mgpu launch`` worker, whose output goes to files). Other ranks report nothing."""
    if rank != 0:
        return None
    if sys.stderr.isatty():
        from mgpucli.cli.progress import RichReporter

        return RichReporter()
    from mgpucli.cli.lines import LineReporter
    from mgpucli.launch import progress_file

    path = os.environ.get(progress_file.ENV)  # mgpu launch on a terminal draws the bar from it
    return progress_file.ProgressFileReporter(LineReporter(), path) if path else LineReporter()


def _train(recipe, overrides, resume, overwrite, env) -> None:
    from mgpucli.engine.run import run_training
    from mgpucli.launch.records import mark_started

    run_training(recipe, overrides, resume=resume, overwrite=overwrite, env=env, reporter=_reporter(env.rank),
                 started=mark_started)


def _probe(recipe, overrides, env, probe: ProbeOptions) -> None:
    """Measure; rank 0 renders the report, or writes it to the result file for ``mgpu launch`` to render."""
    from mgpucli.engine.run import run_probe

    report = run_probe(recipe, overrides, env=env, reporter=_reporter(env.rank), steps=probe.steps)
    if report is None:  # ranks other than 0
        return
    if probe.result_file:
        Path(probe.result_file).write_text(json.dumps(report))
        return
    from mgpucli.cli.probe_report import render

    render(report, probe.as_json)


def _check_probe_options(probe: ProbeOptions, resume: str | None, overwrite: bool, check: bool) -> None:
    from mgpucli.errors import UsageError

    if probe.steps < 1:
        raise UsageError(f"--probe-steps {probe.steps}: the probe needs at least one step to time.")
    clash = "--check" if check else "--resume" if resume else "--overwrite" if overwrite else None
    if clash:
        raise UsageError(f"--probe and {clash} don't combine: the probe measures a fresh start and writes nothing, "
                         "no checkpoint read and no run dir taken.", f"Drop {clash} (or --probe).")


def _recorded(run) -> None:
    """Run ``run``. Unexpected exceptions go through torch's @record, which writes the error file (with the
    traceback) that torchrun's agent reports; an MgpuError is a message for the user, printed without one."""
    from torch.distributed.elastic.multiprocessing.errors import record

    def guarded() -> MgpuError | None:
        try:
            run()
        except MgpuError as err:
            return err
        return None

    err = record(guarded)()
    if err is not None:
        raise err
