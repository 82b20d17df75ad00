"""The worker's ``script`` job: run the user's own training script as this rank, as ``python`` would run it.

``python -m mgpucli.launch.worker script [--local-rank-flag FLAG] (PATH | -m MODULE) [ARGS...]`` runs

- ``PATH`` with :func:`runpy.run_path` as ``__main__``, ``sys.argv = [PATH, *ARGS]`` and ``sys.path[0]`` the
  script's directory, as ``python PATH ARGS`` does;
- ``-m MODULE`` with :func:`runpy.run_module` (``alter_sys``), the working directory first on ``sys.path``, as
  ``python -m MODULE ARGS`` does;

with ``FLAG=LOCAL_RANK`` before the arguments when the launcher was given ``--local-rank-arg``. Nothing heavy
(torch included) is imported before the script's first line: a script that sets environment variables before
``import torch`` keeps working. With ``--audit`` (``mgpu launch --audit``), :mod:`mgpucli.audit` is armed first: its
checks are installed when the script imports torch, and finish when the script ends.

The worker (:mod:`mgpucli.launch.worker`) wraps it as it wraps a recipe: the launcher-death watch, and on failure
``mgpu_failure.json`` beside torch's error file. Here, an exception that ends the script is handled as torch's
``@record`` would (the exception and its traceback into torch's error file, even when the script has no
``@record``) and printed as Python prints it, without mgpu's own frames; the process then exits 1, as Python does.
A ``SystemExit`` keeps the script's own exit code. :func:`mgpucli.progress` is enabled: a failure is recorded with
the step the script reached, and a collective timeout names the step every rank had reached.
"""

from __future__ import annotations

import faulthandler
import gc
import os
import runpy
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from types import TracebackType

from mgpucli import env_vars
from mgpucli.distributed.env import RankEnv, read_rank_env
from mgpucli.distributed.heartbeat import Heartbeat
from mgpucli.errors import UsageError
from mgpucli.launch import nested
from mgpucli.launch.script import LOCAL_RANK_FLAGS, ScriptTarget

_PACKAGE_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# mgpu's wrappers around torch's public functions: their frames say nothing to the user
_TRANSPARENT = {os.path.join(_PACKAGE_DIR, "distributed", "observed.py"),
                os.path.join(_PACKAGE_DIR, "launch", "nested.py")}
USAGE = "script [--local-rank-flag FLAG] [--audit] (PATH | -m MODULE) [ARGS...]"


@dataclass(frozen=True)
class ScriptJob:
    """``script [--local-rank-flag FLAG] [--audit] (PATH | -m MODULE) [ARGS...]``: what ``mgpu launch`` passes for a
    script."""

    target: ScriptTarget

    @classmethod
    def parse(cls, args: Sequence[str]) -> ScriptJob:
        """The job from the arguments after ``script``; everything after the target is the script's."""
        rest = list(args)
        flag = None
        if rest[:1] == ["--local-rank-flag"]:
            if len(rest) < 2 or rest[1] not in LOCAL_RANK_FLAGS:
                raise UsageError(f"python -m mgpucli.launch.worker: --local-rank-flag takes one of "
                                 f"{', '.join(LOCAL_RANK_FLAGS)}.", f"A launched worker runs {USAGE}.")
            flag, rest = rest[1], rest[2:]
        audit = rest[:1] == ["--audit"]
        if audit:
            rest = rest[1:]
        if rest[:1] == ["-m"] and len(rest) >= 2:
            return cls(ScriptTarget(module=rest[1], args=tuple(rest[2:]), local_rank_flag=flag, audit=audit))
        if rest and rest[0] != "-m":
            return cls(ScriptTarget(path=rest[0], args=tuple(rest[1:]), local_rank_flag=flag, audit=audit))
        raise UsageError("python -m mgpucli.launch.worker: script needs a script path or -m MODULE.",
                         f"A launched worker runs {USAGE}.")

    def for_restart(self, environ: Mapping[str, str] | None = None) -> ScriptJob:
        """A restart runs the script as it was given: a script resumes itself (TORCHELASTIC_RESTART_COUNT tells it)."""
        return self

    def run(self) -> None:
        from mgpucli.distributed import step_progress
        from mgpucli.run_records.worker_records import mark_started

        role = _role()
        argv = self.target.argv(str(role.local_rank))
        beat = _observe_progress(role)
        nested.own_rendezvous(beat.world_size)  # one rank: what the script starts finds a rendezvous of its own
        step_progress.enable(beat)
        faulthandler.enable(all_threads=True)  # a crash in native code prints every thread's stack, as under @record
        mark_started()  # the launch record becomes the run dir's launch.json (a --run-dir with an earlier launch)
        audit = None
        if self.target.audit:
            import mgpucli.audit as audit

            audit.arm()  # the checks go in when the script imports torch
        stopped: SystemExit | None = None
        try:
            namespace = _run_script(self.target, argv)  # kept until the audit's end: the script's model is in it
            beat.stop()
        except SystemExit as stop:
            beat.stop()
            if audit is not None:
                audit.finish(clean=True)  # the script chose to end here, whatever its code
            stopped = SystemExit(stop.code)  # a fresh one: the script's own holds its frames, and its objects
        except KeyboardInterrupt:
            raise
        except BaseException as exc:
            beat.stop()
            _fail(exc, step_progress.current_step(), step_progress.timeout_note(exc))
            if audit is not None:
                audit.finish(clean=False)
            sys.exit(1)  # as Python ends on an uncaught exception; `exc` is its context, for the failure record
        else:
            if audit is not None:
                audit.finish(clean=True)
            del namespace
        # The script's objects go now, while the interpreter is whole: a DDP module (its reducer holds the process
        # group and gloo's work, in reference cycles) left for the interpreter's shutdown makes torch 2.13 abort
        # some exits ("terminate called without an active exception"; 2 of 20 runs of a plain script under
        # torchrun, none of 24 with the objects collected first).
        gc.collect()
        if stopped is not None:
            raise stopped


def _role() -> RankEnv:
    """This rank's role; a single process's when the environment cannot say (a bad one is the script's to report)."""
    try:
        return read_rank_env()
    except Exception:  # noqa: BLE001
        return RankEnv()


def _observe_progress(role: RankEnv) -> Heartbeat:
    """The rank's heartbeat, writing from before the script's first line (so the stall watch sees every rank), and
    once the script imports torch, what it observes there (:mod:`mgpucli.distributed.observed`) and the
    nested-launcher guard (:mod:`mgpucli.launch.nested`). Imports nothing heavy."""
    from mgpucli.distributed import observed
    from mgpucli.distributed.step_progress import PHASE
    from mgpucli.torch_import import when_torch_loads

    rank, world_size = role.rank, role.world_size
    beat = Heartbeat(rank, world_size, extra=observed.snapshot)
    beat.phase = PHASE
    beat.start(connect=False)

    def install() -> None:
        try:
            observed.install(stall_watch=os.environ.get(env_vars.NO_STALL_WATCH) != "1")
            nested.install(rank, world_size)
        except Exception as err:  # noqa: BLE001 - observing must never stop the script
            print(f"mgpu: could not observe the script's progress ({type(err).__name__}: {err}); a hang is then "
                  "seen only through mgpucli.progress(step).", file=sys.stderr, flush=True)

    when_torch_loads(install)
    return beat


def _run_script(target: ScriptTarget, argv: list[str]) -> dict:
    """Run the script; its globals when it ends."""
    if target.module is not None:
        sys.argv = [target.module, *argv]  # run_module puts the module's file in argv[0], as python -m does
        return runpy.run_module(target.module, run_name="__main__", alter_sys=True)
    path = str(target.path)
    sys.argv = [path, *argv]
    sys.path[0] = os.path.dirname(os.path.abspath(path))  # python PATH: the script's directory, not the cwd
    return runpy.run_path(path, run_name="__main__")


def _fail(exc: BaseException, step: int | None, note: str | None) -> None:
    """What an exception that ends the script leaves: its step on it (for the failure record), the timeout note
    in its traceback, torch's error file, and the traceback on stderr, all without mgpu's and runpy's frames."""
    exc.__traceback__ = _user_frames(exc.__traceback__)
    if step is not None and getattr(exc, "mgpu_step", None) is None:
        try:
            exc.mgpu_step = step  # type: ignore[attr-defined]
        except AttributeError:
            pass
    if note:
        exc.add_note(note)
    _record_in_error_file(exc)
    sys.excepthook(type(exc), exc, exc.__traceback__)  # the script's own hook, if it installed one
    sys.stderr.flush()


def _user_frames(tb: TracebackType | None) -> TracebackType | None:
    """The traceback from the script's first frame on: mgpu's worker and runpy's frames above it left out, and the
    frames of mgpu's wrappers around torch's functions (:data:`_TRANSPARENT`) wherever they are."""
    runpy_files = {os.path.abspath(runpy.__file__), "<frozen runpy>"}  # a frozen stdlib names its frames so
    while tb is not None and tb.tb_next is not None:
        filename = tb.tb_frame.f_code.co_filename
        if filename not in runpy_files and not os.path.abspath(filename).startswith(_PACKAGE_DIR + os.sep):
            break
        tb = tb.tb_next
    kept, at = [], tb
    while at is not None:
        if os.path.abspath(at.tb_frame.f_code.co_filename) not in _TRANSPARENT:
            kept.append(at)
        at = at.tb_next
    if not kept:
        return tb
    for frame, after in zip(kept, [*kept[1:], None], strict=True):
        frame.tb_next = after
    return kept[0]


def _record_in_error_file(exc: BaseException) -> None:
    """Torch's ``@record`` for the script: the exception and its traceback in the error file torch's agent reads
    (``TORCHELASTIC_ERROR_FILE``). Called while ``exc`` is being handled: torch formats the current exception."""
    try:
        from torch.distributed.elastic.multiprocessing.errors import get_error_handler

        get_error_handler().record_exception(exc)
    except Exception:  # noqa: BLE001 - torch missing or the log dir gone: the stderr log still has it all
        pass
