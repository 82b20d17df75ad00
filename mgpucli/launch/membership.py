"""An elastic job's membership changes, said on every node and recorded: who was lost or joined, from which step the
job goes on, on what, what it cost.

When a restart's rendezvous finds other nodes than the round before (:class:`mgpucli.launch.rendezvous_watch.Round`),
the launcher waits for the new attempt's workers to start training (their ``mgpu_started`` mark, which says the step
they start after and their layout), then says one line and records it in the attempt (``launch.json``)::

    mgpu launch: node 1 lost at step 40; continuing on 1 node x 1 process(es) after step 39, the last step every rank
    completed: global batch 64 = 1 x 32 x grad_accum 2; 0 steps lost, 14 s without training.

"At step N" is the step this node's ranks were in when the collective failed; the last step every rank completed is
the one before it. Steps lost: that step minus the one the workers resumed after (0 when a survivor kept it,
:mod:`mgpucli.engine.checkpoints.rescue`). Seconds without training: from the end of the last attempt's training on
this node (its ranks' first failure or stop record) to the new attempt's start mark.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

from mgpucli.errors import EXIT_PREEMPTED
from mgpucli.run_records.first_failure import failure_records
from mgpucli.run_records.launch_record import Attempt, LaunchRecord
from mgpucli.run_records.worker_records import started_at, started_details

_EVERY_S = 0.5


def describe(change: dict[str, Any]) -> str:
    """The line (without ``mgpu launch: ``) for a change as :func:`measure` records it."""
    who = "; ".join(part for part in (_who(change.get("lost"), "lost", change.get("in_step")),
                                      _who(change.get("joined"), "joined", None)) if part)
    nodes = int(change.get("nodes") or 0)
    where = f"{nodes} node{'s' if nodes != 1 else ''} x {change.get('nproc')} process(es)"
    after, completed = change.get("resumed_after"), change.get("completed")
    if completed is not None and after == completed:
        since = f"after step {after}, the last step every rank completed"
    elif completed is not None:
        why = ("; under FSDP the lost node's shards of the steps since went with it"
               if change.get("strategy") == "fsdp" else "")
        since = f"from its latest checkpoint, after step {after}{why}"
    else:
        since = f"after step {after}"
    layout = (f"global batch {change.get('global_batch')} = {change.get('world_size')} x {change.get('batch_size')} x "
              f"grad_accum {change.get('grad_accum')}")
    lost = change.get("steps_lost")
    cost = (f"{lost} step{'s' if lost != 1 else ''} lost, " if lost is not None else "") + \
        f"{change.get('seconds_without_training')} s without training"
    return f"{who}; continuing on {where} {since}: {layout}; {cost}."


def _who(labels: Any, what: str, step: Any) -> str:
    if not labels:
        return ""
    at = f" at step {step}" if isinstance(step, int) and what == "lost" else ""
    return f"{', '.join(labels)} {what}{at}"


def measure(before: Attempt | None, now: Attempt, lost: list[str], joined: list[str], nodes: int,
            nproc: int) -> dict[str, Any] | None:
    """The change's record once ``now``'s workers started training (None until then)."""
    mark = next((f.error_file for f in now.ranks.values() if started_at(f.error_file) is not None), None)
    if mark is None:
        return None
    details = started_details(mark) or {}
    records = failure_records(before) if before is not None else []
    marks = [started_details(f.error_file) for f in before.ranks.values()] if before is not None else []
    strategy = next((m.get("strategy") for m in marks if m), None)  # what the lost attempt trained with
    failed = [r.step for r in records if r.step is not None and r.exit_code != EXIT_PREEMPTED]  # the step in progress
    saved = [r.step for r in records if r.step is not None and r.exit_code == EXIT_PREEMPTED]  # a stop's saved step
    stopped = [r.time for r in records]
    began = started_at(mark)
    change: dict[str, Any] = {
        "lost": lost, "joined": joined, "nodes": nodes, "nproc": nproc, "in_step": max(failed, default=None),
        "completed": max([*(step - 1 for step in failed), *saved], default=None), "resumed_after": details.get("step"),
        "world_size": details.get("world_size"), "batch_size": details.get("batch_size"),
        "grad_accum": details.get("grad_accum"), "strategy": strategy,
        "seconds_without_training": round(began - min(stopped), 1) if stopped and began is not None else None,
    }
    if all(isinstance(change[k], int) for k in ("world_size", "batch_size", "grad_accum")):
        change["global_batch"] = change["world_size"] * change["batch_size"] * change["grad_accum"]
    if change["completed"] is not None and isinstance(change["resumed_after"], int):
        change["steps_lost"] = max(0, change["completed"] - change["resumed_after"])
    return change


class MembershipWatch(threading.Thread):
    """Says and records each membership change of this launcher's attempts (see the module)."""

    def __init__(self, record: LaunchRecord, say: Callable[[str], None]):
        super().__init__(name="mgpu-membership", daemon=True)
        self.record, self.say = record, say
        self._pending: list[tuple[int, list[str], list[str], int, int]] = []
        self._lock = threading.Lock()
        self._finished = threading.Event()

    def changed(self, attempt: int, lost: list[str], joined: list[str], nodes: int, nproc: int) -> None:
        """Attempt ``attempt`` starts on other nodes than the one before: say it once its training starts."""
        with self._lock:
            self._pending.append((attempt, lost, joined, nodes, nproc))

    def run(self) -> None:
        while not self._finished.wait(_EVERY_S):
            self._check()

    def finish(self) -> None:
        self._finished.set()
        self.join(timeout=5)
        self._check()

    def _check(self) -> None:
        with self._lock:
            pending = list(self._pending)
        for item in pending:
            attempt, lost, joined, nodes, nproc = item
            now, before = self.record.attempt(attempt), self.record.attempt(attempt - 1)
            change = measure(before, now, lost, joined, nodes, nproc) if now is not None else None
            if change is None:
                continue
            with self._lock:
                self._pending.remove(item)
            now.membership = {**change, "said": describe(change)}
            self.record.write()
            self.say(f"mgpu launch: {now.membership['said']}")
