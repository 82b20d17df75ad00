"""The result of a matcher, and the small helpers matchers share (pure)."""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from mgpucli.postmortem.lines import LogLine


@dataclass
class Match:
    """A recognised failure on one rank: what it is, the lines that show it, and what to do."""

    signature: str
    title: str
    rank: int | None
    evidence: list[LogLine]
    fix: str
    cause: bool = True  # False: an echo of another rank's failure (it waited for, or lost, a peer)
    step: int | None = None
    details: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {"signature": self.signature, "title": self.title, "rank": self.rank, "cause": self.cause,
                "step": self.step, "evidence": [e.to_json() for e in self.evidence], "fix": self.fix,
                "details": self.details}


Matcher = Callable[[Sequence[LogLine]], "Match | None"]


def hit_ranks(hits: Sequence[tuple[LogLine, re.Match[str]]]) -> list[int]:
    return sorted({line.rank for line, _ in hits if line.rank is not None})


def of_rank(lines: Sequence[LogLine], rank: int | None) -> list[LogLine]:
    """The lines of one rank, in order."""
    return [line for line in lines if line.rank == rank]


def following(lines: Sequence[LogLine], anchor: LogLine, count: int, pattern: re.Pattern[str] | None = None
               ) -> list[LogLine]:
    """Up to ``count`` lines of the same rank right after ``anchor`` (optionally only those matching)."""
    out, seen = [], False
    for line in lines:
        if line is anchor:
            seen = True
            continue
        if seen and line.rank == anchor.rank and line.text.strip():
            if pattern is None or pattern.search(line.text):
                out.append(line)
            if len(out) >= count:
                break
    return out


def scan(lines: Sequence[LogLine], patterns: Sequence[re.Pattern[str]]) -> list[tuple[LogLine, re.Match[str]]]:
    """Every line matching one of ``patterns`` (the first that matches), in line order."""
    hits = []
    for line in lines:
        for pattern in patterns:
            found = pattern.search(line.text)
            if found:
                hits.append((line, found))
                break
    return hits


def first_rank_hits(hits: list[tuple[LogLine, re.Match[str]]]) -> list[tuple[LogLine, re.Match[str]]]:
    """The hits of the rank whose hit comes first."""
    rank = hits[0][0].rank
    return [(line, m) for line, m in hits if line.rank == rank]
