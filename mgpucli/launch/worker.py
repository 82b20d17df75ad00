"""What every ``mgpu launch`` worker runs: ``python -m mgpucli.launch.worker train RECIPE [overrides] [options]``.

It is ``mgpu train`` (the same CLI, the same arguments) with three things around it that only a launched
worker needs:

1. a watch on the launcher's pid, so the worker dies with the launcher even if that is SIGKILLed;
2. on a torchelastic restart, ``--resume auto`` (and no ``--overwrite``): see :mod:`mgpucli.launch.restart`;
3. on failure, ``mgpu_failure.json`` next to torch's ``@record`` error file: the exception type, message,
   step and whether a retry can help, so the launcher can stop retrying a failure that repeats.

torch's ``error.json`` itself is written by ``mgpu train`` (its entry is wrapped in ``@record``).
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import time

from mgpucli.errors import EXIT_PREEMPTED, Preempted
from mgpucli.launch import parent_watch, restart
from mgpucli.run_records.worker_records import FailureRecord, failure_step, is_retryable, record_path, write_record


def _exit_code(exc: BaseException) -> int | None:
    if isinstance(exc, SystemExit):
        code = exc.code
        return code if isinstance(code, int) else (0 if code is None else 1)
    return 1


def _record_failure(exc: BaseException) -> None:
    """Write ``mgpu_failure.json`` beside torch's error file (only under torchrun, where that path is set)."""
    error_file = os.environ.get("TORCHELASTIC_ERROR_FILE")
    if not error_file:
        return
    code = _exit_code(exc)
    # `mgpu train` turns an MgpuError into sys.exit(code) inside its except block: the error is the context.
    cause = exc.__context__ if isinstance(exc, SystemExit) and exc.__context__ is not None else exc
    from mgpucli.distributed.env import read_rank_env

    try:
        env = read_rank_env()
        rank, local_rank = env.rank, env.local_rank
    except Exception:
        rank = local_rank = -1
    rec = FailureRecord(
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
        write_record(record_path(error_file), rec)


def _exit_through_signals() -> None:
    """After a graceful stop (checkpoint saved, record written) only the interpreter's exit is left, and it takes a
    second or more. torch's agent sends SIGTERM to every rank still running the moment the first one exits; a rank
    killed by it there would turn this exit 75 into a death by SIGTERM, and the launcher would report a job that
    was preempted when a worker got the signal as failed. So SIGTERM and SIGINT are ignored from here on: the
    agent's grace period and a second Ctrl-C at the launcher end in SIGKILL, which still works."""
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, signal.SIG_IGN)


def direct_train_args(args: list[str]) -> dict | None:
    """``train RECIPE [overrides] [--resume X] [--overwrite]`` (what mgpu launch passes) as ``train()``'s
    arguments; None for anything else, which goes through the full CLI.

    Calling the train command directly skips typer altogether (mgpu's whole app, typer's per-parameter pydantic
    adapters, typer's import): 0.1-0.15 s of every worker's time to first step and ~1 MiB of resident memory
    (benchmarks/overhead.py).
    """
    if len(args) < 2 or args[0] != "train" or args[1].startswith("-"):
        return None
    parsed: dict = {"recipe": args[1], "overrides": [], "resume": None, "overwrite": False, "check": False}
    rest = iter(args[2:])
    for token in rest:
        if token == "--resume":
            parsed["resume"] = next(rest, None)
            if parsed["resume"] is None:
                return None
        elif token.startswith("--resume="):
            parsed["resume"] = token.split("=", 1)[1]
        elif token == "--overwrite":
            parsed["overwrite"] = True
        elif token.startswith("-"):  # another option (--check, --help, --): the CLI knows it
            return None
        else:
            parsed["overrides"].append(token)
    return parsed


def _run_cli(args: list[str]) -> None:
    direct = direct_train_args(args)
    if direct is not None:
        from mgpucli.cli.train_run import run_train

        run_train(**direct)
        return
    from mgpucli.cli.app import main as mgpu_main

    sys.argv = ["mgpu", *args]
    mgpu_main()


def main(argv: list[str] | None = None) -> None:
    args = list(sys.argv[1:] if argv is None else argv)
    parent_watch.install_parent_watch()
    args = restart.restart_worker_argv(args)
    try:
        _run_cli(args)
    except SystemExit as exc:
        code = _exit_code(exc)
        if code not in (0, None):
            _record_failure(exc)
        if code == EXIT_PREEMPTED:
            _exit_through_signals()
        raise
    except KeyboardInterrupt:
        raise  # the agent forwarded Ctrl-C: not a failure of this worker
    except BaseException as exc:
        _record_failure(exc)
        raise


if __name__ == "__main__":
    main()
