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
import sys
import time

from mgpucli.launch import restart, watch
from mgpucli.launch.records import FailureRecord, failure_step, is_retryable, record_path, write_record


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
    from mgpucli.dist.env import read_rank_env

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
    )
    with contextlib.suppress(OSError):  # the log dir is gone: the launcher falls back to torch's error file
        write_record(record_path(error_file), rec)


def main(argv: list[str] | None = None) -> None:
    args = list(sys.argv[1:] if argv is None else argv)
    watch.install_parent_watch()
    args = restart.restart_worker_argv(args)
    from mgpucli.cli.app import main as mgpu_main

    sys.argv = ["mgpu", *args]
    try:
        mgpu_main()
    except SystemExit as exc:
        if _exit_code(exc) not in (0, None):
            _record_failure(exc)
        raise
    except KeyboardInterrupt:
        raise  # the agent forwarded Ctrl-C: not a failure of this worker
    except BaseException as exc:
        _record_failure(exc)
        raise


if __name__ == "__main__":
    main()
