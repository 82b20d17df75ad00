"""Where in the user's own code: the innermost frame outside torch, the standard library, installed packages and
mgpu (the rule :func:`mgpucli.run_records.stacks.user_frame` applies to stack dumps). When no frame of the user's own
code is on the stack (an object built by a library for the script, a script that is itself an installed package's
module), the innermost frame of the library that made the call, named (``Where.library``): every finding has a place.
"""

from __future__ import annotations

import linecache
import os
import sys
from types import FrameType

from mgpucli.run_records.audit_records import Where
from mgpucli.run_records.stacks import Frame, ThreadStack, user_frame
from mgpucli.training_libraries import package_of

started_in = os.getcwd()  # the worker's directory when the script started (mgpucli.audit.arm sets it)

_MGPU_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep


def _library_frame(frames: list[Frame]) -> tuple[Frame, str] | None:
    """The innermost frame of an installed package other than torch, else torch's own: (frame, package)."""
    fallback = None
    for f in frames:
        library = package_of(f.file)
        if library is None or os.path.abspath(f.file).startswith(_MGPU_DIR):
            continue
        if library != "torch":
            return f, library
        if fallback is None:
            fallback = (f, library)
    return fallback


def where_in(frames: list[Frame]) -> Where | None:
    """The place a finding names, from the innermost frame outwards: the user's own line, else the library's that
    made the call (named), else None (no frame but the interpreter's and mgpu's)."""
    found = user_frame(ThreadStack("", True, frames))
    if found is not None:
        path = os.path.join(started_in, found.file)
        return Where(file=path, line=found.line, function=found.function,
                     code=linecache.getline(path, found.line).strip())
    library = _library_frame(frames)
    if library is None:
        return None
    frame, name = library
    return Where(file=frame.file, line=frame.line, function=frame.function,
                 code=linecache.getline(frame.file, frame.line).strip(), library=name)


def live_frames(skip: int = 0) -> list[FrameType]:
    """The running frames, innermost first, from the caller of this function's caller (``skip``: that many further
    out)."""
    frame = sys._getframe(skip + 2)
    frames = []
    while frame is not None:
        frames.append(frame)
        frame = frame.f_back
    return frames


def where_of(frames: list[FrameType]) -> Where | None:
    """:func:`where_in` for running frames."""
    return where_in([Frame(f.f_code.co_filename, f.f_lineno, f.f_code.co_name) for f in frames])


def user_where() -> Where | None:
    """The user's line that is running now (the call that created the object being checked), or the library's that
    made that call; None only on a stack without either (the audit's own thread)."""
    return where_of(live_frames())
