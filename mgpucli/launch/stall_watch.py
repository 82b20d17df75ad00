"""``trainer.stall_s`` / ``--stall-s``: a rank that makes no progress for that long stops the job, showing where.

Each worker's heartbeat rewrites ``mgpu_progress.json`` (its step and phase) every second beside its logs
(:mod:`mgpucli.distributed.heartbeat`; a script's through ``mgpucli.progress``). The launcher reads them every
second; a rank whose step and phase have not changed for ``stall_s`` seconds is stalled: every live rank is asked
for its stacks (:mod:`mgpucli.run_records.stacks`), the stall is recorded, and the workers are stopped. A rank
that never wrote progress (a script that doesn't call ``mgpucli.progress``) is never judged. Off by default: the
timeout of collectives (``trainer.timeout_s``) already ends a job whose ranks wait for each other; a stall also
catches a rank stuck where no collective is waiting for it yet, sooner.
"""

from __future__ import annotations

import re
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from mgpucli.run_records import stacks
from mgpucli.run_records.launch_record import LaunchRecord
from mgpucli.run_records.worker_records import read_progress

_COLLECTIVE = re.compile(r"all-reduce|all_reduce|broadcast|gather|barrier|collective", re.IGNORECASE)


@dataclass
class Stall:
    rank: int
    step: int
    phase: str
    seconds: float

    def describe(self, stall_s: float) -> str:
        return (f"rank {self.rank} made no progress for {self.seconds:.0f} s (stall_s={stall_s:g}): still at step "
                f"{self.step} in '{self.phase}'")

    def to_json(self) -> dict:
        return {"rank": self.rank, "step": self.step, "phase": self.phase, "seconds": round(self.seconds, 1)}


class StallWatch(threading.Thread):
    """Watches the latest attempt's ranks on this node; calls ``stop_workers`` once when one stalls."""

    def __init__(self, record: LaunchRecord, stall_s: float, stop_workers: Callable[[], object],
                 every_s: float = 1.0):
        super().__init__(name="mgpu-stall-watch", daemon=True)
        self.record, self.stall_s, self.stop_workers, self.every_s = record, stall_s, stop_workers, every_s
        self.stall: Stall | None = None
        self._finished = threading.Event()
        self._last: dict[tuple[int, int], tuple[object, float]] = {}  # (attempt, rank) -> (progress, since)

    def run(self) -> None:
        while self.stall is None and not self._finished.wait(self.every_s):
            found = self.check(time.monotonic())
            if found is not None:
                self._stop_job(found)

    def finish(self) -> None:
        self._finished.set()
        self.join(timeout=10)

    def check(self, now: float) -> Stall | None:
        """A rank whose (step, phase) is unchanged for ``stall_s`` seconds, or None. When several are (a stuck rank
        holds the others in their next collective), the one furthest behind, and one outside a collective first:
        that is the one stuck."""
        attempt = self.record.attempts[-1] if self.record.attempts else None
        if attempt is None:
            return None
        stalled = []
        for rank, files in sorted(attempt.ranks.items()):
            progress = read_progress(files.error_file)
            if progress is None:
                continue
            state = (progress.get("step"), progress.get("phase"))
            key = (attempt.attempt, rank)
            seen, since = self._last.get(key, (None, now))
            if state != seen:
                self._last[key] = (state, now)
            elif now - since >= self.stall_s:
                stalled.append(Stall(rank, int(state[0] or 0), str(state[1]), now - since))
        if not stalled:
            return None
        return min(stalled, key=lambda s: (s.step, _COLLECTIVE.search(s.phase) is not None, s.rank))

    def _stop_job(self, stall: Stall) -> None:
        attempt = self.record.attempts[-1]
        targets = []
        for files in attempt.ranks.values():
            path = stacks.stacks_path(files.error_file) if files.error_file else None
            pid = stacks.read_pid(path) if path else None
            if pid is not None:
                targets.append((pid, path))
        if targets:
            stacks.request([pid for pid, _ in targets], [path for _, path in targets])
        self.stall = stall
        self.stop_workers()
