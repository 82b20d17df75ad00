"""The ``mgpu`` command run inside the test process: for what needs no process of its own (a refusal, a message, a
help text, a ``--dry-run``), at the cost of a function call instead of a Python start and an ``import torch``.

:func:`cli` runs the console script's own entry (:func:`mgpucli.cli.app.main`) with ``sys.argv``, the working
directory and the environment a subprocess would get, captures stdout and stderr, and returns the same
:class:`tests.procs.Result` as :func:`tests.procs.mgpu`, so ``assert_usage_error`` reads both alike. Starting a
process from inside the call fails the test: a command that needs one is a test for ``tests/e2e``, through the
real console script. What the call changes in the process (environment, working directory, ``sys.path``, signal
handlers, torch's thread count, the garbage collector) is put back afterwards. Modules it imported stay imported, as
in any process that imports them twice.
"""

from __future__ import annotations

import contextlib
import gc
import io
import os
import signal
import subprocess
import sys
import time
import traceback
from pathlib import Path

from tests.procs import Result

_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGUSR1, signal.SIGUSR2, signal.SIGQUIT)


class ProcessStarted(AssertionError):
    """A command run in-process tried to start a process."""


# The one child an in-process launch may start: the launcher composes the recipe in it while it imports torch's agent
# (mgpucli/launch/compose_child.py). It imports neither torch nor mgpu's engine.
COMPOSE_CHILD = "mgpucli.launch.compose_child"


@contextlib.contextmanager
def _no_process(allowed: tuple[str, ...]):
    """Fail any ``subprocess.Popen`` (what torch's agent, mgpu's proctree and multiprocessing's spawn use) and
    ``os.fork`` inside the block, but for a ``python -m MODULE`` of a module in ``allowed``."""
    real_init, real_fork = subprocess.Popen.__init__, os.fork
    tried: list[str] = []

    def refuse(what: str):
        tried.append(what)  # kept: the command may catch the exception and go on another way
        raise ProcessStarted(f"an in-process mgpu call started a process ({what}): test it in tests/e2e")

    def popen(self, args, *rest, **kwargs):
        if isinstance(args, list | tuple) and any(str(a) in allowed for a in args):
            return real_init(self, args, *rest, **kwargs)
        refuse(repr(args))

    subprocess.Popen.__init__ = popen
    os.fork = lambda: refuse("os.fork")
    try:
        yield
    finally:
        subprocess.Popen.__init__, os.fork = real_init, real_fork
    if tried:
        raise ProcessStarted(f"an in-process mgpu call started a process ({tried[0]}): test it in tests/e2e")


@contextlib.contextmanager
def _process_state(cwd: Path, env: dict[str, str] | None, argv: list[str]):
    """The process as ``mgpu ARGV`` in ``cwd`` would start, put back as it was afterwards."""
    saved_env, saved_cwd, saved_argv, saved_path = dict(os.environ), os.getcwd(), sys.argv, list(sys.path)
    saved_signals = {sig: signal.getsignal(sig) for sig in _SIGNALS}
    saved_gc = gc.isenabled(), gc.get_threshold(), gc.get_freeze_count()
    torch = sys.modules.get("torch")
    saved_threads = torch.get_num_threads() if torch else None
    os.environ.update({"PYTHONUNBUFFERED": "1", **(env or {})})
    os.chdir(cwd)
    sys.argv = ["__main__.py", *argv]  # with __package__ below: what `python -m mgpucli` sees
    main_module = sys.modules["__main__"]
    saved_package = getattr(main_module, "__package__", None)
    main_module.__package__ = "mgpucli"  # click names the program from it: "python -m mgpucli", as tests.procs runs it
    try:
        yield
    finally:
        os.chdir(saved_cwd)
        os.environ.clear()
        os.environ.update(saved_env)
        sys.argv = saved_argv
        sys.path[:] = saved_path  # a run puts its working directory first (engine/run.py): not the next test's
        main_module.__package__ = saved_package
        for sig, handler in saved_signals.items():
            if handler is not None:
                signal.signal(sig, handler)
        enabled, threshold, frozen = saved_gc
        if gc.get_freeze_count() != frozen:
            gc.unfreeze()
        gc.set_threshold(*threshold)
        (gc.enable if enabled else gc.disable)()
        if torch is not None and torch.get_num_threads() != saved_threads:
            torch.set_num_threads(saved_threads)


def cli(*args: str, cwd: Path, env: dict[str, str] | None = None, allowed: tuple[str, ...] = ()) -> Result:
    """``mgpu ARGS`` in ``cwd`` with ``env`` added to this process's environment, run in this process: its exit
    code, stdout and stderr (an uncaught exception's traceback on stderr, exit 1, as Python prints it). The call
    may start no process but ``python -m M`` for a module ``M`` in ``allowed`` (:data:`COMPOSE_CHILD` for a launch
    refused by its recipe check)."""
    out, err = io.StringIO(), io.StringIO()
    start = time.monotonic()
    code: int = 0
    with _process_state(Path(cwd), env, list(args)), _no_process(allowed), contextlib.redirect_stdout(out), \
            contextlib.redirect_stderr(err):
        from mgpucli.cli.app import main

        try:
            main()
        except SystemExit as done:
            if isinstance(done.code, str):
                print(done.code, file=sys.stderr)
            code = 1 if isinstance(done.code, str) else int(done.code or 0)
        except ProcessStarted:
            raise
        except BaseException:  # what Python would print for an uncaught exception, and its exit code
            traceback.print_exc(file=sys.stderr)
            code = 1
    return Result(code, out.getvalue(), err.getvalue(), os.getpid(), time.monotonic() - start)
