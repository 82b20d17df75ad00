"""A script launch whose ranks all exited 0: did it train, or end before it began? (stdlib only)

torchrun reports a script that exits 0 on every rank as a success, whatever it did. A DDP example run where it finds
fewer GPUs than it wants prints "Unable to locate sufficient 2 gpus" and calls ``sys.exit()``: a success, and nothing
trained. Each rank's heartbeat says, in its last beat (``mgpu_progress.json``, written as the script ends), whether
it ever joined a process group, how many optimizer steps it took, and how much CPU the processes it started used
(:mod:`mgpucli.distributed.observed`): when no rank did any of it (a script that spawns its own processes in a job
of one rank did), ``mgpu launch`` and ``mgpu doctor RUN_DIR`` say so, with the script's last line.
"""

from __future__ import annotations

from dataclasses import dataclass

from mgpucli.run_records.launch_record import Attempt
from mgpucli.run_records.worker_records import ENDED, log_tail, read_progress, started_at

CHILDREN_WORKED_S = 0.5  # CPU seconds of the processes a rank started (and waited for) that count as their work


@dataclass(frozen=True)
class NeverTrained:
    """Every rank ended without joining a process group or taking an optimizer step."""

    seconds: float | None  # how long the longest rank ran the script (None: unknown)
    last_line: str | None  # the script's last line of output (the lowest rank's stdout, else its stderr)

    def describe(self) -> str:
        took = f" after {self.seconds:.1f} s" if self.seconds is not None else ""
        said = f'; its last line: "{self.last_line}"' if self.last_line else "; it printed nothing"
        return f"the script exited{took} on every rank without joining a process group or training{said}"


def never_trained(attempt: Attempt) -> NeverTrained | None:
    """:class:`NeverTrained` when every rank of ``attempt`` on this node ended its script (its heartbeat's last beat)
    without joining a process group, taking an optimizer step or reporting a step; None otherwise, or when a rank
    left no last beat to read (killed, or not a script)."""
    if not attempt.ranks:
        return None
    seconds = []
    for files in attempt.ranks.values():
        last = read_progress(files.error_file)
        if last is None or _did_something(last):
            return None
        began = started_at(files.error_file)
        if began is not None and isinstance(last.get("time"), int | float):
            seconds.append(max(0.0, last["time"] - began))
    first = attempt.ranks[min(attempt.ranks)]
    said = log_tail(first.stdout, 1) or log_tail(first.stderr, 1)
    return NeverTrained(max(seconds) if seconds else None, said[-1].strip() if said else None)


def _did_something(last: dict) -> bool:
    """Whether a rank's last beat shows it (or what it started) at work, or is no script's last beat."""
    return (last.get("phase") != ENDED or last.get("joined") is not False or bool(last.get("optimizer_steps"))
            or bool(last.get("step")) or (last.get("children_cpu_s") or 0) >= CHILDREN_WORKED_S)
