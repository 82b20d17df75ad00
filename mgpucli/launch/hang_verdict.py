"""Which rank holds a hung script's job up, from every rank's last progress (pure).

A launched script's ranks publish what mgpu observes at torch's public points (:mod:`mgpucli.distributed.observed`):
the waiting ``torch.distributed`` call each is in, how many it entered, whether it joined the process group. When
the job stalls (or is stopped by Ctrl-C), :func:`verdict` names the ranks behind:

- ranks that never joined the process group while others joined it or wait in ``init_process_group``;
- ranks outside any collective while others wait in one (the rank the others wait for);
- ranks waiting in different collectives, or a different number of them (every rank's line matters);

and :func:`lines` says it with each rank's innermost line of user code from its stacks. A recipe's ranks publish
a step and a phase instead: no verdict, the stall's own description stands.
"""

from __future__ import annotations

from dataclasses import dataclass

from mgpucli.run_records import stacks

INIT = "init_process_group"  # as mgpucli.distributed.observed names it


@dataclass
class Verdict:
    kind: str  # never_joined, outside_collective, different_collectives (the post-mortem's fix depends on it)
    ranks: list[int]  # the ranks behind (named first)
    headline: str
    what: dict[int, str]  # rank -> what it did wrong, for its line ("never joined the process group")


def observed(progress: dict | None) -> bool:
    return progress is not None and "joined" in progress


def _names(ranks: list[int]) -> str:
    return f"rank {ranks[0]}" if len(ranks) == 1 else "ranks " + ", ".join(str(r) for r in ranks)


def _waits(ranks: list[int]) -> str:
    return "waits" if len(ranks) == 1 else "wait"


def verdict(progress: dict[int, dict | None]) -> Verdict | None:
    """The ranks behind, from each rank's last published progress (None: it published none); None when the ranks'
    progress says nothing of their collectives (a recipe) or nobody is waiting for anybody."""
    if not any(observed(p) for p in progress.values()):
        return None
    joining = sorted(r for r, p in progress.items() if observed(p) and (p["joined"] or p.get("collective") == INIT))
    never = sorted(set(progress) - set(joining))
    if joining and never:
        what = "never joined the process group"
        waiting = [r for r in joining if progress[r].get("collective") == INIT]  # type: ignore[union-attr]
        joined = [r for r in joining if r not in waiting]
        others = "; ".join(([f"{_names(waiting)} {_waits(waiting)} for it in {INIT}"] if waiting else [])
                           + ([f"{_names(joined)} joined without it"] if joined else []))
        return Verdict("never_joined", never, f"{_names(never)} {what} ({others})", dict.fromkeys(never, what))
    inside = {r: p["collective"] for r, p in progress.items() if observed(p) and p.get("collective")}
    outside = sorted(r for r in progress if r not in inside)
    if inside and outside:
        names = sorted(set(inside.values()))
        waiting = sorted(inside)
        what = f"is outside the {' / '.join(names)} the others wait in"
        headline = f"{_names(outside)} never entered the {' / '.join(names)} {_names(waiting)} {_waits(waiting)} in"
        return Verdict("outside_collective", outside, headline, dict.fromkeys(outside, what))
    if len(inside) > 1:
        calls = {r: (inside[r], progress[r]["calls"]) for r in inside}  # type: ignore[index]
        if len(set(calls.values())) > 1:
            said = ", ".join(f"rank {r} in {name} (its call {n})" for r, (name, n) in sorted(calls.items()))
            ranks = sorted(calls)
            return Verdict("different_collectives", ranks, f"the ranks wait in different collectives: {said}",
                           {r: f"waits in {name} (its call {n})" for r, (name, n) in calls.items()})
    return None


def lines(found: Verdict | None, dumps: dict[int, stacks.Dump], ranks: list[int]) -> list[str]:
    """One line per rank: where it was (its innermost line of user code); the ranks behind first, with what they
    did wrong."""
    out = []
    named = found.ranks if found is not None else []
    for rank in [*named, *(r for r in sorted(ranks) if r not in named)]:
        dump = dumps.get(rank)
        where = stacks.describe(rank, dump) if dump is not None else f"rank {rank}: no stacks (it had exited?)"
        if found is not None and rank in found.what:
            where = where.replace(f"rank {rank} was ", f"rank {rank} {found.what[rank]}: it was ", 1)
        out.append(where)
    return out
