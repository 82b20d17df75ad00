"""Where each rank's step time goes, as ``metrics.jsonl`` holds it, and the straggler read from it. Stdlib only:
the trainer writes the figures, the terminal summary and ``mgpu doctor RUN_DIR`` read them the same way.

Each train record (one per log interval) carries ``anatomy``: a list indexed by rank of
``{"step_s": seconds per optimizer step, "data": share, "compute": share, "comm": share, "optimizer": share,
"other": share}``, the shares of that rank's wall time over the interval (they add up to 1):

- ``data``: waiting for the next batch (``next()`` on the loader: the loader's own work with 0 workers, the wait
  for a worker's batch otherwise);
- ``compute``: forward and backward, up to the moment the last gradient is computed;
- ``comm``: the rest of backward: waiting for the gradient all-reduce beyond what overlapped with backward (DDP:
  from the last gradient computed to backward's return; 0 on one process and where it is not separated, FSDP);
- ``optimizer``: gradient clipping, the optimizer and scheduler steps, zeroing the gradients;
- ``other``: everything else (the log interval's own reduction, checkpoints, EMA, the loop itself).

A straggler is a rank that every other rank waits for: its busy time (wall minus comm) leads the others' by a fifth of
its step or more, its comm share is at most half of any other's, and the others' comm wait covers at least half its
lead, in three intervals or more and three in four of them (the first, warm-up, left out). Ranks that merely take
turns waiting for each other (a loaded machine) name nobody.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

KEY = "anatomy"
PHASES = ("data", "compute", "comm", "optimizer", "other")
LEAD_SHARE = 0.2  # the straggler's lead is at least this share of its step time...
COVERED = 0.5  # ...and the others wait in comm for at least this part of that lead...
QUIET = 0.5  # ...while its own comm share is at most this part of theirs (it barely waits)...
PERSISTENT = 0.75  # ...in at least this share of the intervals...
MIN_INTERVALS = 3  # ...and in at least this many
CAUSES = {"data": ("data",), "compute": ("compute",), "host": ("optimizer", "other")}  # a cause: its phases


def figures(seconds: list[float], wall_s: float, steps: int) -> dict[str, float]:
    """One rank's record entry from its seconds in data, compute, comm and optimizer over ``wall_s`` seconds."""
    known = dict(zip(PHASES[:4], seconds, strict=True))
    wall = max(wall_s, sum(seconds), 1e-12)
    out = {"step_s": wall_s / steps if steps else 0.0}
    out.update({name: value / wall for name, value in known.items()})
    out["other"] = max(0.0, 1.0 - sum(out[name] for name in PHASES[:4]))
    return out


def scalars(record: dict[str, Any]) -> dict[str, float]:
    """A record's anatomy as flat scalars for TensorBoard and trackers: ``anatomy/rank1/data`` and so on."""
    ranks = record.get(KEY)
    if not isinstance(ranks, list):
        return {}
    return {f"{KEY}/rank{rank}/{name}": float(value) for rank, entry in enumerate(ranks) if isinstance(entry, dict)
            for name, value in entry.items() if isinstance(value, (int, float))}


@dataclass
class Straggler:
    rank: int
    cause: str  # data | compute | host
    share: float  # the straggler's mean share of its cause
    others_comm: float  # the other ranks' mean comm share
    lead_s: float  # the straggler's mean lead per step, seconds
    step_s: float
    intervals: int  # the intervals it led
    of: int  # the intervals looked at

    def as_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


def _busy(entry: dict[str, float]) -> float:
    return entry["step_s"] * (1.0 - entry["comm"])


def _leader(ranks: list[dict[str, float]]) -> tuple[int, float] | None:
    """The rank every other waited for in this interval, and its lead in seconds per step; None if none did."""
    busy = [_busy(e) for e in ranks]
    lead_rank = max(range(len(ranks)), key=busy.__getitem__)
    others = [r for r in range(len(ranks)) if r != lead_rank]
    lead = busy[lead_rank] - max(busy[r] for r in others)
    step = ranks[lead_rank]["step_s"]
    waits = [ranks[r]["comm"] * ranks[r]["step_s"] for r in others]
    if (step > 0 and lead >= LEAD_SHARE * step and min(waits) >= COVERED * lead
            and ranks[lead_rank]["comm"] <= QUIET * min(ranks[r]["comm"] for r in others)):
        return lead_rank, lead
    return None


def _usable(record: dict[str, Any]) -> list[dict[str, float]] | None:
    ranks = record.get(KEY)
    if (record.get("split", "train") != "train" or not isinstance(ranks, list) or len(ranks) < 2
            or not all(isinstance(e, dict) and all(isinstance(e.get(k), (int, float)) for k in ("step_s", *PHASES))
                       for e in ranks)):
        return None
    return ranks


def find_straggler(records: list[dict[str, Any]]) -> Straggler | None:
    """The rank the others persistently wait for in these train records, and why; None when there is none.

    The first interval (warm-up: allocations, DDP's bucket rebuild, the loader's first batch) is left out when there
    are three or more."""
    intervals = [r for r in (_usable(record) for record in records) if r is not None]
    if len(intervals) >= 3:
        intervals = intervals[1:]
    led: dict[int, list[tuple[list[dict[str, float]], float]]] = {}
    for ranks in intervals:
        found = _leader(ranks)
        if found is not None:
            led.setdefault(found[0], []).append((ranks, found[1]))
    if not led:
        return None
    rank, seen = max(led.items(), key=lambda item: len(item[1]))
    if len(seen) < MIN_INTERVALS or len(seen) < PERSISTENT * len(intervals):
        return None
    cause = _cause(rank, [ranks for ranks, _ in seen])
    return Straggler(rank, cause, share=_mean(sum(ranks[rank][n] for n in CAUSES[cause]) for ranks, _ in seen),
                     others_comm=_mean(e["comm"] for ranks, _ in seen for i, e in enumerate(ranks) if i != rank),
                     lead_s=_mean(lead for _, lead in seen), step_s=_mean(ranks[rank]["step_s"] for ranks, _ in seen),
                     intervals=len(seen), of=len(intervals))


def _mean(values) -> float:
    values = list(values)
    return sum(values) / len(values) if values else 0.0


def _excess(rank: int, intervals: list[list[dict[str, float]]]) -> dict[str, float]:
    """Per cause, the straggler's seconds per step beyond the other ranks' mean, over the intervals it led."""
    def seconds(entry: dict[str, float], names: tuple[str, ...]) -> float:
        return entry["step_s"] * sum(entry[n] for n in names)

    out = {}
    for cause, names in CAUSES.items():
        mine = _mean(seconds(ranks[rank], names) for ranks in intervals)
        theirs = _mean(seconds(e, names) for ranks in intervals for i, e in enumerate(ranks) if i != rank)
        out[cause] = mine - theirs
    return out


def _cause(rank: int, intervals: list[list[dict[str, float]]]) -> str:
    excess = _excess(rank, intervals)
    return max(excess, key=excess.__getitem__)


def summary(found: Straggler, num_workers: Any = None, pin_memory: Any = None, device: str | None = None,
            script: bool = False) -> str:
    """One line for people: who, how much, why, and the fix in the recipe's terms (a script's with ``script``)."""
    what, fix = explain(found, num_workers, pin_memory, device, script)
    return f"{what}: {fix}."


def explain(found: Straggler, num_workers: Any = None, pin_memory: Any = None, device: str | None = None,
            script: bool = False) -> tuple[str, str]:
    """(who waits for whom and why, the fix)."""
    head = f"rank {found.rank} "
    others = (f"the others wait for rank {found.rank} in all-reduce ({found.others_comm:.0%} of theirs), in "
              f"{found.intervals} of {found.of} intervals")
    if found.cause == "data":
        if script:
            fix = "raise its DataLoader's num_workers, set pin_memory=True on GPUs, or check that rank's reads"
        elif num_workers in (0, "0", None):
            fix = f"raise data.num_workers (now {num_workers})"
        else:
            fix = (f"raise data.num_workers (now {num_workers})"
                   + (", set data.pin_memory=true" if device == "cuda" and pin_memory is False else "")
                   + ", or check that rank's dataset reads (a slow disk, a slow transform)")
        return f"{head}waits for data {found.share:.0%} of its steps; {others}", fix
    if found.cause == "compute":
        return (f"{head}computes {found.lead_s * 1000:.0f} ms per step longer than the others; {others}",
                "its device or cores are slower or shared (run `mgpu doctor` on its machine: CPU, NUMA, PCIe "
                "findings), or its batches are bigger (the same batch size and sequence lengths on every rank)")
    threads = "" if script else "; on CPU workers lower trainer.cpu_threads"
    return (f"{head}spends {found.share:.0%} of its steps outside data and compute (optimizer, Python, logging); "
            f"{others}", f"another process may share its cores (run `mgpu doctor` on its machine{threads})")
