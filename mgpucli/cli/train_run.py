"""What ``mgpu train`` does, without typer: the command line's ``train`` and every ``mgpu launch`` worker call it.

A launched worker calls :func:`run_train` directly (mgpucli.launch.worker), so it imports neither typer nor,
unless rank 0 has a terminal, rich: ~3 MiB of resident memory per rank that the hand-written loop
does not pay (benchmarks/overhead.py).
"""

from __future__ import annotations

import os
import sys

from mgpucli.errors import MgpuError, Preempted


def run_train(recipe: str, overrides: list[str], resume: str | None = None, overwrite: bool = False,
              check: bool = False) -> None:
    """Train from a recipe on this process (one worker of a job when RANK/WORLD_SIZE are set)."""
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
        if check:
            from mgpucli.cli.check import check_and_print
            from mgpucli.run_files import check_start

            check_and_print(recipe, overrides, quiet=rank not in (None, 0),
                            check_run_dir=lambda run_dir, sharded: check_start(run_dir, resume, overwrite, sharded))
            return
        _run(recipe, overrides, resume, overwrite, env)
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


def _run(recipe, overrides, resume, overwrite, env) -> None:
    """Train. Unexpected exceptions go through torch's @record, which writes the error file (with the
    traceback) that torchrun's agent reports; an MgpuError is a message for the user, printed without one."""
    from torch.distributed.elastic.multiprocessing.errors import record

    from mgpucli.engine.run import run_training
    from mgpucli.run_records.worker_records import mark_started

    def guarded() -> MgpuError | None:
        try:
            run_training(recipe, overrides, resume=resume, overwrite=overwrite, env=env, reporter=_reporter(env.rank),
                         started=mark_started)
        except MgpuError as err:
            return err
        return None

    err = record(guarded)()
    if err is not None:
        raise err
