"""``--stall-s`` / ``trainer.stall_s``: a rank that makes no progress for that long stops the job, showing where.

Each worker's heartbeat rewrites ``mgpu_progress.json`` every second beside its logs
(:mod:`mgpucli.distributed.heartbeat`): a recipe's step and phase; a script's progress as mgpu observes it at
torch's public points (optimizer steps, the waiting ``torch.distributed`` calls, :mod:`mgpucli.distributed.observed`),
written from before the script's first line. The launcher reads them every second; a rank whose progress has not
changed for the limit is stalled: every live rank is asked for its stacks (:mod:`mgpucli.run_records.stacks`), the
stall is recorded, and the workers are stopped. A rank that wrote no progress while others did is judged too, from
the moment the others appeared.

The limit given (``--stall-s N``, ``trainer.stall_s``) judges progress alone. Without one, the default
(:data:`DEFAULT_STALL_S`) also counts the rank's own CPU time as progress (``busy_share``): a rank that computes
(a long validation, a save, a first step that compiles) is not stalled, one that waits for nothing to arrive is.
"""

from __future__ import annotations

import re
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from mgpucli.distributed.heartbeat import ENDED
from mgpucli.run_records import stacks
from mgpucli.run_records.launch_record import LaunchRecord
from mgpucli.run_records.worker_records import read_progress

_COLLECTIVE = re.compile(r"all-reduce|all_reduce|broadcast|gather|barrier|collective", re.IGNORECASE)
DEFAULT_STALL_S = 600.0  # without a limit given: 10 minutes without progress or CPU work (docs/scripts.md)
BUSY_SHARE = 0.1  # under the default, CPU time of a tenth of the limit counts as progress
_NOT_PROGRESS = ("time", "cpu_s")


def where_phase(progress: dict | None) -> str:
    """What a rank's last progress says it was doing: a recipe's step and phase, a script's observed calls."""
    if progress is None:
        return "it wrote no progress"
    if "joined" not in progress:
        return f"still at step {progress.get('step')} in '{progress.get('phase')}'"
    steps = progress.get("optimizer_steps") or 0
    after = f"after {steps} optimizer step(s)"
    if progress.get("collective"):
        return f"in {progress['collective']} (its call {progress.get('calls')}), {after}"
    if not progress.get("joined"):
        return "before init_process_group"
    return f"outside any collective, {after}"


@dataclass
class Stall:
    rank: int
    step: int
    phase: str
    seconds: float
    progress: dict | None = None  # the rank's last published progress (None: it published none)

    def describe(self, stall_s: float) -> str:
        return f"rank {self.rank} made no progress for {self.seconds:.0f} s (stall_s={stall_s:g}): " \
            f"{where_phase(self.progress)}"

    def to_json(self) -> dict:
        return {"rank": self.rank, "step": self.step, "phase": self.phase, "seconds": round(self.seconds, 1)}


@dataclass
class _Seen:
    state: tuple
    since: float
    cpu_s: float | None


class StallWatch(threading.Thread):
    """Watches the latest attempt's ranks on this node; calls ``stop_workers`` once when one stalls."""

    def __init__(self, record: LaunchRecord, stall_s: float, stop_workers: Callable[[], object],
                 every_s: float = 1.0, busy_share: float | None = None):
        super().__init__(name="mgpu-stall-watch", daemon=True)
        self.record, self.stall_s, self.stop_workers, self.every_s = record, stall_s, stop_workers, every_s
        self.busy_share = busy_share  # None: progress alone; else CPU time of this share of stall_s counts too
        self.stall: Stall | None = None
        self.progress: dict[int, dict | None] = {}  # every rank's last progress, at the last check
        self._finished = threading.Event()
        self._last: dict[tuple[int, int], _Seen] = {}  # (attempt, rank) -> its progress, since when, its CPU then

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
        progress = {rank: read_progress(files.error_file) for rank, files in sorted(attempt.ranks.items())}
        if all(p is None for p in progress.values()):
            return None  # nothing started yet: a rank without progress is judged once another has some
        self.progress = progress
        stalled = []
        for rank, mine in progress.items():
            if mine is not None and mine.get("phase") == ENDED:
                continue  # its work is done: the others may go on without it
            state = tuple(sorted((k, v) for k, v in mine.items() if k not in _NOT_PROGRESS)) if mine else ()
            cpu = mine.get("cpu_s") if mine else None
            key = (attempt.attempt, rank)
            seen = self._last.get(key)
            if seen is None or seen.state != state or self._busy(seen, cpu):
                self._last[key] = _Seen(state, now, cpu)
            elif now - seen.since >= self.stall_s:
                mine = mine or {}
                stalled.append(Stall(rank, int(mine.get("step") or 0), str(mine.get("phase")), now - seen.since,
                                     progress[rank]))
        if not stalled:
            return None
        return min(stalled, key=lambda s: (s.progress is not None, s.step, _COLLECTIVE.search(s.phase) is not None
                                           or bool(s.progress and s.progress.get("collective")), s.rank))

    def frozen_s(self, now: float) -> float:
        """How long the rank that moved last has been still (0 before the first check)."""
        sinces = [seen.since for (attempt, _), seen in self._last.items()
                  if self.record.attempts and attempt == self.record.attempts[-1].attempt]
        return now - max(sinces) if sinces else 0.0

    def _busy(self, seen: _Seen, cpu: float | None) -> bool:
        """Under the default: the rank used CPU time of ``busy_share`` of the limit since its progress last moved."""
        return (self.busy_share is not None and cpu is not None and seen.cpu_s is not None
                and cpu - seen.cpu_s >= self.busy_share * self.stall_s)

    def _stop_job(self, stall: Stall) -> None:
        stacks.request_live([files.error_file for files in self.record.attempts[-1].ranks.values()])
        self.stall = stall
        self.stop_workers()
