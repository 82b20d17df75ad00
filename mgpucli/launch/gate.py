"""The launcher's verdict on a recipe, which its workers wait for: they start while it checks (stdlib only).

``mgpu launch`` composes the recipe, builds the plan and checks the run dir (all quick), then starts torch's agent at
once, and checks the rest of the recipe meanwhile (the ``_target_`` signatures, the trackers, the optimizer,
scheduler, task and model built: what imports most of torch, and its dynamo). The part that needs no worker (the
``_target_``s, the trackers) begins as soon as the recipe is composed (:meth:`Gate.begin`): its refusal, found before
the agent starts the workers, starts none. Each worker imports what its job
needs (torch, the engine) during that check and then waits here, before it trains or writes anything, for the
launcher's verdict: a small JSON file that says ``go`` or ``refused``. A refused launch kills the workers (one that is
not yet waiting ends at the verdict, exit 2, writing nothing), removes what the launch created (the run dir if it
made it, else its log folders) and fails with the check's own error, exit 2: nothing the user sees is left, as when
the check ran before any worker started.

The verdict's path is in ``MGPU_LAUNCH_VERDICT``; a worker waits for it only while its parent is the launcher that
named it (``MGPU_LAUNCH_PID``), so a stray variable never holds up a ``mgpu train`` under plain torchrun.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
import threading
import time
from collections.abc import Callable

from mgpucli import env_vars
from mgpucli.distributed.env import read_rank_env
from mgpucli.run_records.json_files import read_json_object, write_json

ENV = "MGPU_LAUNCH_VERDICT"
GO, REFUSED = "go", "refused"
_POLL_S = 0.005


class _Abandoned(Exception):
    """The job ended while the check still waited for its workers."""


class Gate:
    """The launcher's side: the verdict file, the check that gives it, and what a refusal removes."""

    def __init__(self) -> None:
        self._dir = tempfile.mkdtemp(prefix="mgpu-verdict-")
        self.path = os.path.join(self._dir, "verdict")
        self.lock = threading.Lock()  # the verdict and the writes held until it (the launch record)
        self.passed = False
        self._abandoned = threading.Event()
        self.error: BaseException | None = None
        self._thread: threading.Thread | None = None
        self._first: threading.Thread | None = None  # begin()'s part of the check
        self._created: list[str] = []  # folders this launch created, removed on a refusal
        self._before: dict[str, set[str]] = {}  # folders it writes in: what they held before

    def begin(self, first: Callable[[], None], on_refusal: Callable[[], None]) -> None:
        """Start ``first``, the part of the check that needs no worker, now, in a thread of its own: a refusal it finds
        sets :attr:`error` at once (and runs ``on_refusal``), so that one found before the agent starts any worker
        starts none. :meth:`check`'s part runs once it has passed."""
        self._first = threading.Thread(target=self._run_first, args=(first, on_refusal), name="mgpu-recipe-check-first",
                                       daemon=True)
        self._first.start()

    def check(self, run_check: Callable[[], None], on_go: Callable[[], None], on_refusal: Callable[[], None]) -> None:
        """What :meth:`start` runs in a thread: ``run_check`` (once :meth:`begin`'s part, if any, has passed); then
        ``on_go`` (under the lock) and the verdict ``go``, or the verdict ``refused`` and ``on_refusal`` (which ends
        the workers)."""

        def run() -> None:
            if self._first is not None:
                self._first.join()
                if self.error is not None:
                    return
            try:
                run_check()
            except _Abandoned:  # the workers ended first (a crash): no verdict; the job's failure is told
                return
            except BaseException as err:  # noqa: BLE001 - any failure of the check refuses the launch
                self._refuse(err, on_refusal)
                return
            with self.lock:
                on_go()
                self.passed = True
                write_json(self.path, {"verdict": GO})

        self._thread = threading.Thread(target=run, name="mgpu-recipe-check", daemon=True)

    def _run_first(self, first: Callable[[], None], on_refusal: Callable[[], None]) -> None:
        try:
            first()
        except BaseException as err:  # noqa: BLE001 - any failure of the check refuses the launch
            self._refuse(err, on_refusal)

    def _refuse(self, err: BaseException, on_refusal: Callable[[], None]) -> None:
        with self.lock:
            self.error = err
            write_json(self.path, {"verdict": REFUSED})
        on_refusal()

    def builds_checked(self, source: str) -> None:
        """Wait for local rank 0's report on building the recipe's components (:func:`check_builds_here`): the
        workers import what building them imports anyway (torch's dynamo, the components' modules), this launcher
        never does. Raises the problems it found, as :func:`mgpucli.config.components.check_builds` would here."""
        from mgpucli.errors import raise_reported

        path = _builds_report(self.path)
        while (report := read_json_object(path)) is None:
            if self._abandoned.wait(_POLL_S):
                raise _Abandoned
        raise_reported(report, source)
        if report.get("crash"):
            raise RuntimeError(f"building the recipe's components failed:\n{report['crash']}")

    def abandon(self) -> None:
        """The job ended (its workers are gone): a check still waiting for them stops."""
        self._abandoned.set()

    def start(self) -> None:
        """Start the check (as torch's agent starts the workers)."""
        if self._thread is not None and self._thread.ident is None:
            self._thread.start()

    def refused(self) -> BaseException | None:
        """Wait for the check to end (:meth:`begin`'s part, and :meth:`check`'s once started); the error it refused
        the launch with (None: it passed)."""
        for thread in (self._first, self._thread):
            if thread is not None and thread.ident is not None:
                thread.join()
        return self.error

    def note(self, folder: str) -> None:
        """Before the launch creates ``folder`` or writes in it: what a refusal removes. The highest of its folders
        that does not exist yet; or, when it exists, whatever comes into it from now on."""
        path = os.path.abspath(folder)
        if os.path.isdir(path):
            self._before[path] = set(os.listdir(path))
            return
        while not os.path.exists(os.path.dirname(path)):
            path = os.path.dirname(path)
        self._created.append(path)

    def remove_created(self) -> None:
        """After a refusal: remove what this launch created (its workers are gone)."""
        for folder, before in self._before.items():
            for name in set(os.listdir(folder)) - before if os.path.isdir(folder) else ():
                path = os.path.join(folder, name)
                if os.path.isdir(path) and not os.path.islink(path):
                    shutil.rmtree(path, ignore_errors=True)
                else:
                    with contextlib.suppress(OSError):
                        os.unlink(path)
        for path in self._created:
            shutil.rmtree(path, ignore_errors=True)

    def close(self) -> None:
        shutil.rmtree(self._dir, ignore_errors=True)


def _builds_report(verdict: str) -> str:
    """Local rank 0's report on building the components, beside the verdict."""
    return os.path.join(os.path.dirname(verdict), "builds.json")


def check_builds_here(source: str, overrides: list[str], environ: dict[str, str] | None = None) -> None:
    """In every worker of a launch that waits for it, before the verdict: build the recipe's components as the
    launcher's check would (:func:`mgpucli.config.components.check_builds`: nothing written, the model on the meta
    device); local rank 0 reports what went wrong, or nothing, beside the verdict. The other ranks build them too,
    for what building imports (a Transformers model's modules take seconds): meanwhile rather than after the
    verdict, as under plain torchrun. The recipe is the one the launcher composed and handed to the workers
    (:mod:`mgpucli.config.handoff`), or, should that file be missing, composed here."""
    import traceback

    env = os.environ if environ is None else environ
    verdict, launcher = env.get(ENV), env.get(env_vars.LAUNCH_PID)
    if not verdict or not launcher or str(os.getppid()) != launcher:
        return
    if os.path.exists(verdict):  # a restart of the job: the launcher gave its verdict already
        return
    from mgpucli.errors import MgpuError, error_report

    report: dict = {}
    try:
        from mgpucli.config import handoff, load_recipe
        from mgpucli.config.components import check_builds
        from mgpucli.engine.run import ensure_cwd_on_path

        ensure_cwd_on_path()  # the user's components in the working directory, as the launcher finds them
        cfg = handoff.read(source, overrides)
        check_builds(cfg if cfg is not None else load_recipe(source, overrides), source)
    except MgpuError as err:
        report = error_report(err)
    except Exception:  # noqa: BLE001 - a bug in a component: the launcher shows its traceback
        report = {"crash": traceback.format_exc()}
    if read_rank_env(env).local_rank == 0:
        write_json(_builds_report(verdict), report)


def wait_for_verdict(environ: dict[str, str] | None = None) -> None:
    """The worker's side: return once the launcher said ``go`` (at once when no launcher is checking for this
    worker); end the process with exit 2, writing nothing, when it refused the launch."""
    env = os.environ if environ is None else environ
    path, launcher = env.get(ENV), env.get(env_vars.LAUNCH_PID)
    if not path or not launcher or str(os.getppid()) != launcher:
        return
    while (verdict := read_json_object(path)) is None:
        if str(os.getppid()) != launcher:  # the launcher is gone (its watch ends this worker too)
            os._exit(1)
        time.sleep(_POLL_S)
    if verdict.get("verdict") != GO:
        os._exit(2)  # refused: nothing of this worker may remain (no failure record, no exit hooks)
