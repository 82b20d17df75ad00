"""Where in the user's own code: the innermost frame outside torch, the standard library, installed packages and
mgpu (the rule :func:`mgpucli.run_records.stacks.user_frame` applies to stack dumps)."""

from __future__ import annotations

import linecache
import os
import sys

from mgpucli.run_records.audit_records import Where
from mgpucli.run_records.stacks import Frame, ThreadStack, user_frame

started_in = os.getcwd()  # the worker's directory when the script started (mgpucli.audit.arm sets it)


def user_where() -> Where | None:
    """The user's line that is running now (the call that created the object being checked), or None."""
    frame = sys._getframe(1)
    frames = []
    while frame is not None:
        frames.append(Frame(frame.f_code.co_filename, frame.f_lineno, frame.f_code.co_name))
        frame = frame.f_back
    found = user_frame(ThreadStack("", True, frames))
    if found is None:
        return None
    path = os.path.join(started_in, found.file)
    return Where(file=path, line=found.line, function=found.function, code=linecache.getline(path, found.line).strip())
