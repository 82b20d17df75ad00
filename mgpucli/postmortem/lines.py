"""Log lines that know their rank, their file and their line number (pure: stdlib only).

One rank's log file holds that rank's lines; a terminal capture or a combined log holds lines of several
ranks, each prefixed by torch's launcher (``[rank3]:``, mgpu's template; ``[default3]:``, torchrun's
default; sometimes twice, when a tee'd worker line is itself prefixed). ``parse`` strips those prefixes and
gives each line its rank, so every matcher works the same on one rank's file and on interleaved output.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

# "[rank3]:", "[default3]:", "[trainer3]:", repeated, at the start of a line.
_PREFIX = re.compile(r"^(?:\[(?:rank|default|trainer|worker)(\d+)\]:)+")
TAIL_BYTES = 1 << 20  # the last MiB of a log is read (line numbers stay exact: newlines before it are counted)
COUNT_LIMIT = 1 << 28  # ... up to 256 MiB before it; beyond that, line numbers are left out rather than guessed
TAIL_LINES = 600


@dataclass(frozen=True)
class LogLine:
    """One line of evidence: whose, where it was read, and what it says (prefix stripped)."""

    rank: int | None
    text: str
    source: str = ""  # a file path, or "launch.json" for facts the launcher recorded
    line: int | None = None  # 1-based line number in ``source``

    def cite(self) -> str:
        """``rank 1 stderr.log:57`` (the short file name; the full path is in the JSON report)."""
        who = f"rank {self.rank}" if self.rank is not None else ""
        where = os.path.basename(self.source) if self.source else ""
        if where and self.line is not None:
            where += f":{self.line}"
        return f"{who} {where}".strip()

    def to_json(self) -> dict:
        return {"rank": self.rank, "file": self.source, "line": self.line, "text": self.text}


def parse(text: str, rank: int | None = None, source: str = "", first_line: int = 1) -> list[LogLine]:
    """Split ``text`` into LogLines; a ``[rankN]:`` prefix sets the line's rank, else ``rank`` does."""
    out = []
    for number, raw in enumerate(text.splitlines(), start=first_line):
        found = _PREFIX.match(raw)
        line_rank = int(found.group(1)) if found else rank
        body = raw[found.end():] if found else raw
        out.append(LogLine(line_rank, body.rstrip(), source, number))
    return out


def read_log(path: str, rank: int | None, max_lines: int = TAIL_LINES) -> list[LogLine]:
    """The last ``max_lines`` lines of a log file with their true line numbers ([] when missing).

    Logs of long runs are large: only the last MiB is decoded, the newlines before it are counted.
    """
    if not path or not os.path.isfile(path):
        return []
    with open(path, "rb") as fh:
        size = fh.seek(0, os.SEEK_END)
        start = max(0, size - TAIL_BYTES)
        fh.seek(0)
        skipped: int | None = 0
        remaining = start if start <= COUNT_LIMIT else 0
        if start > COUNT_LIMIT:
            skipped = None
            fh.seek(start)
        while remaining > 0:
            chunk = fh.read(min(remaining, 1 << 22))
            if not chunk:
                break
            skipped += chunk.count(b"\n")
            remaining -= len(chunk)
        data = fh.read()
    if start > 0:  # drop the partial first line
        cut = data.find(b"\n")
        data = data[cut + 1:] if cut >= 0 else b""
        if skipped is not None and cut >= 0:
            skipped += 1
    lines = parse(data.decode("utf-8", errors="replace"), rank, path, first_line=(skipped or 0) + 1)
    if skipped is None:
        lines = [LogLine(line.rank, line.text, line.source, None) for line in lines]
    return lines[-max_lines:]


def by_rank(lines: Iterable[LogLine]) -> dict[int | None, list[LogLine]]:
    """Lines grouped by rank, each group in its original order (untangles interleaved output)."""
    groups: dict[int | None, list[LogLine]] = {}
    for line in lines:
        groups.setdefault(line.rank, []).append(line)
    return groups


def first(lines: Sequence[LogLine], pattern: re.Pattern[str]) -> tuple[LogLine, re.Match[str]] | None:
    """The first line matching ``pattern``, with its match."""
    for line in lines:
        found = pattern.search(line.text)
        if found:
            return line, found
    return None


def find_all(lines: Sequence[LogLine], pattern: re.Pattern[str]) -> list[tuple[LogLine, re.Match[str]]]:
    return [(line, m) for line in lines if (m := pattern.search(line.text))]
