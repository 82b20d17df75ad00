"""Python tracebacks found in one rank's log lines (pure).

A traceback is ``Traceback (most recent call last):``, frames (``  File "...", line N, in f`` plus their
source lines and Python 3.11's ``^^^^`` markers), then the exception line ``Type: message``. Chained
exceptions print several; the last one is what killed the process.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, field

from mgpucli.postmortem.lines import LogLine

_START = re.compile(r"^\s*Traceback \(most recent call last\):\s*$")
_FRAME = re.compile(r'^\s*File "(?P<file>[^"]+)", line (?P<line>\d+), in (?P<func>.+)$')
_EXC = re.compile(r"^(?P<type>[A-Za-z_][\w.]*(?:Error|Exception|Exit|Interrupt|Failed|Fault)\w*)(?::\s?(?P<msg>.*))?$")
# Frames that are never "where the user's code failed": the interpreter, torch, the CLI framework.
_LIBRARY = re.compile(r"<frozen |/torch/|/typer/|/click/|/runpy\.py|/threading\.py|/multiprocessing/")


@dataclass
class Frame:
    file: str
    line: int
    func: str
    where: LogLine  # the "File ..." log line
    code: LogLine | None = None  # the source line printed under it


@dataclass
class Traceback:
    """One printed traceback and the exception it ended with."""

    start: LogLine
    frames: list[Frame] = field(default_factory=list)
    exc_line: LogLine | None = None
    exc_type: str = ""
    message: str = ""

    @property
    def short_type(self) -> str:
        return self.exc_type.rsplit(".", 1)[-1]

    def user_frame(self) -> Frame | None:
        """The innermost frame outside torch and the CLI machinery: where the exception came from."""
        for frame in reversed(self.frames):
            if not _LIBRARY.search(frame.file):
                return frame
        return self.frames[-1] if self.frames else None


def _indent(text: str) -> int:
    return len(text) - len(text.lstrip())


def parse_tracebacks(lines: Sequence[LogLine]) -> list[Traceback]:
    """Every complete traceback in ``lines`` (one rank's lines, in order).

    Indentation is measured from the ``Traceback`` line itself: torch's launcher may put a space after the
    ``[rankN]:`` prefix it adds, so the exception line is the first line back at that indentation.
    """
    found: list[Traceback] = []
    current: Traceback | None = None
    base = 0
    for line in lines:
        text = line.text
        if _START.match(text):
            current, base = Traceback(start=line), _indent(text)
            continue
        if current is None:
            continue
        frame = _FRAME.match(text)
        if frame:
            current.frames.append(Frame(frame["file"], int(frame["line"]), frame["func"].strip(), line))
            continue
        if not text.strip() or _indent(text) > base:
            last = current.frames[-1] if current.frames else None
            if last is not None and last.code is None and text.strip() and not set(text.strip()) <= set("^~"):
                last.code = line
            continue
        exc = _EXC.match(text.strip())
        if exc:
            current.exc_line, current.exc_type, current.message = line, exc["type"], (exc["msg"] or "").strip()
            found.append(current)
        current = None
    return found


def last_exception(lines: Sequence[LogLine]) -> Traceback | None:
    tracebacks = parse_tracebacks(lines)
    return tracebacks[-1] if tracebacks else None
