"""The audit in one worker: who this rank is, where its findings go, and the one thread that talks to the store.

Findings are written from the thread that finds them (a line appended to the rank's findings file, once per kind
and place). Whatever needs the other ranks goes through the job's rendezvous store (torchrun's TCPStore at
``MASTER_ADDR:MASTER_PORT``, as :mod:`mgpucli.distributed.heartbeat` uses it), never through a collective: the
script's collectives keep their order, and a rank that never arrives makes nothing wait. Every store operation runs
on one daemon thread, in order (:meth:`Session.later`); the script's thread only queues work. The comparison rule is
"the last to arrive compares" (:meth:`Session.meet`): each rank sets its value, then adds one to a counter; the
rank whose addition completes the count reads every value and decides. No rank waits for another.
"""

from __future__ import annotations

import contextlib
import json
import os
import queue
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

from mgpucli import env_vars
from mgpucli.distributed.store_client import connect_job_store
from mgpucli.run_records.audit_records import Finding, Where, append, findings_path
from mgpucli.run_records.worker_records import ERROR_FILE_ENV

STORE_TIMEOUT_S = 10.0  # connecting to the store, and each operation on it
FINISH_S = 10.0  # the most the end of the script waits for the audit's queued work
FINISH_FAILED_S = 2.0  # the same after the script failed (its findings so far; the job is being torn down)


def _int_env(environ, key: str, default: int) -> int:
    try:
        return int(environ.get(key) or default)
    except ValueError:
        return default


class Session:
    """This rank's audit: its role, its findings file, its counters, and the store thread."""

    def __init__(self, environ=None, store_factory: Callable[[], Any] | None = None):
        env = os.environ if environ is None else environ
        self.rank = _int_env(env, env_vars.RANK, 0)
        self.local_rank = _int_env(env, env_vars.LOCAL_RANK, 0)
        self.world_size = _int_env(env, env_vars.WORLD_SIZE, 1)
        self.local_world_size = _int_env(env, env_vars.LOCAL_WORLD_SIZE, 1)
        self.attempt = _int_env(env, env_vars.RESTART_COUNT, 0)
        error_file = env.get(ERROR_FILE_ENV)
        self.path = findings_path(error_file) if error_file else None
        self.cwd = os.getcwd()
        self.prefix = f"mgpu/audit/{env.get(env_vars.RUN_ID, 'run')}/{self.attempt}/"
        self._environ = env  # where the job's store is (mgpucli.distributed.store_client)
        self._store_factory = store_factory
        self._store: Any = None
        self.store_problem: str | None = None
        self._reported: set[tuple[str, str]] = set()
        self._lock = threading.Lock()
        self.counts: dict[str, int] = {}
        self.notes: list[str] = []
        self.ddp_params: set[int] = set()  # ids of the parameters of every DDP model built
        self.unreduced: set[int] = set()  # ids of the parameters of DDP models that left some without a gradient
        self.library: Any = None  # the training library that built the job's first DDP model (audit.libraries)
        self._finishers: list[Callable[[bool], None]] = []
        self._queue: queue.Queue = queue.Queue()
        self._thread: threading.Thread | None = None
        self._finished = False

    @property
    def distributed(self) -> bool:
        return self.world_size > 1

    # ------------------------------------------------------------------------------------------ findings
    def count(self, what: str, n: int = 1) -> None:
        with self._lock:
            self.counts[what] = self.counts.get(what, 0) + n

    def note(self, text: str) -> None:
        """Something the status line should say (a check that could not run, and why)."""
        if text not in self.notes:
            self.notes.append(text)

    def report(self, kind: str, title: str, cost: str, fix: str, where: Where | None,
               details: dict[str, Any] | None = None, key: str | None = None) -> bool:
        """Record a finding, once per ``kind`` and ``key`` (default: the place) on this rank; True when new."""
        ident = (kind, key if key is not None else (f"{where.file}:{where.line}" if where else ""))
        with self._lock:
            if ident in self._reported:
                return False
            self._reported.add(ident)
        finding = Finding(kind=kind, rank=self.rank, local_rank=self.local_rank, attempt=self.attempt,
                          time=time.time(), title=title, cost=cost, fix=fix, where=where, details=details or {})
        self._write(finding.to_json())
        return True

    def _write(self, record: dict[str, Any]) -> None:
        with self._lock:
            if self.path is not None:
                try:
                    append(self.path, record)
                    return
                except OSError:
                    pass
            # No findings file (not under torchrun, or the log dir is gone): the rank's stderr has it.
            print(f"mgpu audit: {json.dumps(record, default=str)}", file=sys.stderr, flush=True)

    # ------------------------------------------------------------------------------------------ the store
    def later(self, task: Callable[..., None], *args: Any) -> None:
        """Run ``task(*args)`` on the audit's thread, after what is queued already (never on the script's)."""
        if self._finished:
            return
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="mgpu-audit", daemon=True)
            self._thread.start()
        self._queue.put((task, args))

    def _run(self) -> None:
        while True:
            item = self._queue.get()
            if item is None:
                return
            task, args = item
            try:
                task(*args)
            except Exception as err:  # noqa: BLE001 - a check that fails is a note, never the script's problem
                self.note(f"{getattr(task, '__qualname__', task)}: {type(err).__name__}: {err}")

    def store(self) -> Any:
        """The rendezvous store, under this launch's and attempt's prefix (on the audit's thread; None: not
        reachable, and :attr:`store_problem` says why)."""
        if self._store is not None or self.store_problem is not None:
            return self._store
        try:
            if self._store_factory is not None:
                raw = self._store_factory()
            else:
                raw = connect_job_store(STORE_TIMEOUT_S, environ=self._environ)
            import torch.distributed as dist

            self._store = dist.PrefixStore(self.prefix, raw)
        except Exception as err:  # noqa: BLE001
            self.store_problem = f"the rendezvous store is not reachable ({type(err).__name__}: {err})"
            self.note(f"cross-rank checks skipped: {self.store_problem}")
        return self._store

    def meet(self, key: str, value: Any) -> list[Any] | None:
        """Publish this rank's ``value`` under ``key``; the rank that arrives last gets every rank's values (in rank
        order), the others None. Nobody waits: a rank that never arrives leaves the count short."""
        store = self.store()
        if store is None:
            return None
        store.set(f"{key}/{self.rank}", json.dumps(value))
        if store.add(f"{key}/arrived", 1) != self.world_size:
            return None
        keys = [f"{key}/{r}" for r in range(self.world_size)]
        values = [json.loads(v) for v in store.multi_get(keys)]
        for done in [*keys, f"{key}/arrived"]:  # a long run meets thousands of times: leave nothing behind
            with contextlib.suppress(Exception):
                store.delete_key(done)
        return values

    def join(self, key: str) -> tuple[int, set[int]] | None:
        """Add this rank to the set under ``key``: (how many had joined with this one, which ranks are in it now).
        The count comes from one atomic addition, so exactly one rank is the second to join."""
        store = self.store()
        if store is None:
            return None
        store.append(f"{key}/ranks", f"{self.rank} ")
        order = store.add(f"{key}/count", 1)
        return order, {int(r) for r in store.get(f"{key}/ranks").decode().split()}

    # ------------------------------------------------------------------------------------------ the end
    def at_finish(self, callback: Callable[[bool], None]) -> None:
        self._finishers.append(callback)

    def finish(self, clean: bool) -> None:
        """The script ended: the checks' last words (``clean``: it ended without an error), the queued work done
        (at most :data:`FINISH_S`), then this rank's status line."""
        if self._finished:
            return
        for callback in self._finishers:
            try:
                callback(clean)
            except Exception as err:  # noqa: BLE001
                self.note(f"{getattr(callback, '__qualname__', callback)}: {type(err).__name__}: {err}")
        left = 0
        if self._thread is not None:
            self._queue.put(None)
            self._thread.join(timeout=FINISH_S if clean else FINISH_FAILED_S)
            left = self._queue.qsize() + (1 if self._thread.is_alive() else 0)
        self._finished = True
        status = {"record": "status", "rank": self.rank, "local_rank": self.local_rank, "attempt": self.attempt,
                  "time": time.time(), "clean": clean, "checked": dict(self.counts), "notes": list(self.notes)}
        if left:
            status["unfinished"] = left
        with contextlib.suppress(Exception):
            self._write(status)
