"""Per-rank progress in the rendezvous store, so a timed-out collective can say who was late, and where.

Each rank runs a small heartbeat thread that writes ``{step, phase, time, cpu_s}`` (plus what its owner adds:
a script's progress observed at torch's public points, :mod:`mgpucli.distributed.observed`) to the job's c10d store
every second. The main thread only sets two attributes (``step``, ``phase``): no per-step I/O, no host sync. When a
collective times out, the rank that noticed reads every rank's last heartbeat and names the ranks that had
not arrived (behind it, or silent). Under ``mgpu launch`` the same state also goes to ``mgpu_progress.json``
beside the worker's logs, where the launcher watches for a rank that stopped making progress (``trainer.stall_s``).
"""

from __future__ import annotations

import contextlib
import json
import os
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from mgpucli.distributed.store_client import connect_job_store, job_store_address
from mgpucli.run_records.json_files import write_json
from mgpucli.run_records.worker_records import ENDED as ENDED
from mgpucli.run_records.worker_records import ERROR_FILE_ENV, progress_path

KEY = "mgpu/progress/{rank}"


@dataclass
class Seen:
    rank: int
    step: int | None
    phase: str | None
    age_s: float | None  # seconds since its last heartbeat; None: never seen


class Heartbeat:
    """This rank's progress, published by a daemon thread (a no-op without a process group)."""

    def __init__(self, rank: int, world_size: int, interval_s: float = 1.0,
                 extra: Callable[[], dict] | None = None):
        self.rank, self.world_size, self.interval_s, self.extra = rank, world_size, interval_s, extra
        self.step = 0
        self.phase = "setup"
        self._store = None
        # Under mgpu launch, also a file beside the worker's logs: the launcher's stall watch reads it.
        error_file = os.environ.get(ERROR_FILE_ENV)
        self._file = progress_path(error_file) if error_file else None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self, connect: bool = True) -> None:
        """Connect to the job's store (MASTER_ADDR:MASTER_PORT, torchrun's agent store; ``connect=False``: not yet,
        which imports nothing) and start beating."""
        if connect:
            self.connect()
        if self._thread is not None or (self._store is None and self._file is None):
            return
        self._beat()
        self._thread = threading.Thread(target=self._run, name="mgpu-progress", daemon=True)
        self._thread.start()

    def connect(self) -> None:
        """Publish to the job's store too, from the next beat on (imports torch.distributed)."""
        if self._store is None and self.world_size > 1 and job_store_address() is not None:
            try:
                self._store = connect_job_store(timeout_s=10)
            except Exception:  # progress reporting is best effort: never fail a run for it
                self._store = None

    def _beat(self) -> None:
        state = {"step": self.step, "phase": self.phase, "time": time.time(), "cpu_s": round(time.process_time(), 2)}
        if self.extra is not None:
            state.update(self.extra())
        if self._store is not None:
            self._store.set(KEY.format(rank=self.rank), json.dumps(state))
        if self._file is not None:
            with contextlib.suppress(OSError):  # the log dir is gone: the store still has it
                write_json(self._file, state)

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            try:
                self._beat()
            except Exception:
                return

    @contextlib.contextmanager
    def in_phase(self, phase: str) -> Iterator[None]:
        """Label what this rank is doing (e.g. a collective) for the duration of the block."""
        previous, self.phase = self.phase, phase
        try:
            yield
        finally:
            self.phase = previous

    def others(self) -> list[Seen]:
        """Every rank's last heartbeat (this rank's current state included)."""
        seen = []
        now = time.time()
        for rank in range(self.world_size):
            if rank == self.rank:
                seen.append(Seen(rank, self.step, self.phase, 0.0))
                continue
            try:
                key = KEY.format(rank=rank)
                if self._store is None or not self._store.check([key]):
                    seen.append(Seen(rank, None, None, None))
                    continue
                data = json.loads(self._store.get(key))
                seen.append(Seen(rank, data["step"], data["phase"], now - data["time"]))
            except Exception:
                seen.append(Seen(rank, None, None, None))
        return seen

    def stop(self) -> None:
        """Stop beating, after a last beat saying this rank's work has ended (the stall watch leaves it alone)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=2)
            self.phase = ENDED
            with contextlib.suppress(Exception):
                self._beat()


def late_ranks(seen: list[Seen], me: Seen, stale_s: float = 3.0) -> list[Seen]:
    """Ranks that had not arrived where ``me`` is: behind it, in another phase, silent, or never seen."""
    late = []
    for s in seen:
        if s.rank == me.rank:
            continue
        if s.step is None or s.age_s is None or s.age_s > stale_s or s.step < (me.step or 0) \
                or (s.step == me.step and s.phase != me.phase):
            late.append(s)
    return late


def describe(s: Seen) -> str:
    if s.step is None:
        return f"rank {s.rank} (no progress recorded)"
    return f"rank {s.rank} (last seen at step {s.step} in '{s.phase}', {s.age_s:.0f} s ago)"
