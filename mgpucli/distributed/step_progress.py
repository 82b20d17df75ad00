"""``mgpucli.progress(step)``: a user's script tells mgpu which step it reached (a no-op outside ``mgpu launch``).

A script launched by ``mgpu launch`` (:mod:`mgpucli.launch.script_job`) has this module enabled before its first
line, with the rank's heartbeat (:mod:`mgpucli.distributed.heartbeat`), which already writes the progress mgpu
observes by itself (:mod:`mgpucli.distributed.observed`) beside the rank's logs. Each call then stores the step (an
attribute set: no I/O, no device sync) and, on the first call of a multi-process job, connects the heartbeat to the
job's rendezvous store, in the background, so the first call never waits. What it buys:

- a failure is recorded with the step it happened at (the post-mortem's "rank 1 failed first at step 1200");
- a collective that times out is reported with the step every rank had reached, and the ranks that had not
  arrived (:func:`timeout_note`).

Everywhere else (plain ``python``, plain ``torchrun``, a recipe's worker, which has its own heartbeat) it does
nothing.
"""

from __future__ import annotations

import re
import threading

from mgpucli.distributed.heartbeat import Heartbeat, describe, late_ranks

PHASE = "script"
NOTE_HEAD = "mgpu: steps each rank had reached (mgpucli.progress):"  # the post-mortem reads it back
_TIMEOUT = re.compile(r"timed? ?out|timeout", re.IGNORECASE)

_enabled = False
_step: int | None = None
_heartbeat: Heartbeat | None = None
_connecting: threading.Thread | None = None


def enable(heartbeat: Heartbeat | None = None) -> None:
    """Make :func:`progress` count (the script job calls it before running the script, with its heartbeat)."""
    global _enabled, _heartbeat
    _enabled = True
    if heartbeat is not None:
        _heartbeat = heartbeat


def progress(step: int) -> None:
    """Tell ``mgpu launch`` that this rank reached training step ``step`` (an int; call it once per step, anywhere
    in the loop). Cheap enough for every step; outside ``mgpu launch`` it does nothing."""
    global _step, _heartbeat, _connecting
    if not _enabled:
        return
    _step = step
    if _heartbeat is None:
        _heartbeat = _start_heartbeat()
    elif _connecting is None and _heartbeat.world_size > 1:  # connecting may take a moment: never in the step
        _connecting = threading.Thread(target=_heartbeat.connect, name="mgpu-progress-connect", daemon=True)
        _connecting.start()
    _heartbeat.step = step


def current_step() -> int | None:
    """The last step :func:`progress` was given on this rank (None: never called, or not under ``mgpu launch``)."""
    return _step


def _start_heartbeat() -> Heartbeat:
    from mgpucli.distributed.env import read_rank_env

    try:
        env = read_rank_env()
    except Exception:  # progress reporting is best effort: a bad environment is the script's to report
        return Heartbeat(0, 1)
    beat = Heartbeat(env.rank, env.world_size)
    beat.phase = PHASE
    if env.world_size > 1:  # connecting to the store may take a moment: never in the script's step
        threading.Thread(target=beat.start, name="mgpu-progress-start", daemon=True).start()
    return beat


def timeout_note(err: BaseException) -> str | None:
    """For an error that says a collective timed out: the step every rank had reached and the ranks that had not
    arrived (behind this one), from their heartbeats; None when there is nothing to add."""
    beat = _heartbeat
    if beat is None or beat.world_size <= 1 or not _TIMEOUT.search(f"{type(err).__name__}: {err}"):
        return None
    seen = beat.others()
    if not any(s.step is not None for s in seen if s.rank != beat.rank):
        return None
    me = next(s for s in seen if s.rank == beat.rank)
    steps = ", ".join(f"rank {s.rank}: {s.step if s.step is not None else 'none recorded'}" for s in seen)
    note = f"{NOTE_HEAD} {steps}."
    late = [s for s in late_ranks(seen, me) if s.step is None or s.step < (me.step or 0)]
    if late:
        note += " Ranks that had not arrived: " + "; ".join(describe(s) for s in late) + "."
    return note
