"""Every rank writing the same file through ``torch.save`` (checkpoints that clobber each other).

``torch.save`` is wrapped: the first time this rank saves to a path (a file name or a file object with one), the
path, with this machine's name, joins a set in the rendezvous store; the second rank to join it says so, once. Rank 0
alone saving, or every rank saving to a name with its rank in it, is no finding. The save itself is untouched and
never waits for the store.
"""

from __future__ import annotations

import functools
import hashlib
import os
import socket
from typing import Any

from mgpucli.audit import libraries
from mgpucli.audit.session import Session
from mgpucli.torch_parts import replace


def saved_path(f: Any) -> str | None:
    """The absolute path ``torch.save`` writes to (None for an in-memory buffer)."""
    if isinstance(f, (str, os.PathLike)):
        return os.path.abspath(os.fspath(f))
    name = getattr(f, "name", None)
    return os.path.abspath(name) if isinstance(name, str) and name and not name.startswith("<") else None


class Saves:
    def __init__(self, session: Session):
        self.s = session
        self._seen: set[str] = set()
        self._host = socket.gethostname()

    def install(self) -> None:
        if not self.s.distributed:
            return
        checks = self

        def checked(original):
            @functools.wraps(original)
            def save(obj, f, *args, **kwargs):
                try:
                    checks.saving(f)
                except Exception as err:  # noqa: BLE001 - never stand between the script and its file
                    checks.s.note(f"torch.save not checked ({type(err).__name__}: {err})")
                return original(obj, f, *args, **kwargs)

            return save

        replace("torch.save", checked)

    def saving(self, f: Any) -> None:
        path = saved_path(f)
        if path is None or path in self._seen:
            return
        self._seen.add(path)
        self.s.count("files saved")
        call = libraries.here()
        self.s.later(self._meet, path, call.where, call.library)

    def _meet(self, path: str, where, library: libraries.Library | None = None) -> None:
        key = hashlib.sha1(f"{self._host}:{path}".encode()).hexdigest()
        joined = self.s.join(f"save/{key}")
        if joined is None or joined[0] != 2:
            return  # the first rank to write it, or a third one: the second says it, once
        ranks = joined[1]
        shown = ", ".join(map(str, sorted(ranks)))
        others = "" if len(ranks) >= self.s.world_size else f" (so far, of {self.s.world_size})"
        fix, cost = libraries.in_terms(
            "same_save_path",
            "if dist.get_rank() == 0:\n"
            "    torch.save(state, path)\n"
            "dist.barrier()  # the other ranks wait until it is written",
            "Every rank writes the same file at about the same time: the writes clobber each other, and a reader "
            "(or a resume) can get a torn or mixed file. With DDP the ranks hold the same weights, so one write is "
            "all it takes.",
            library, self.s.library)
        self.s.report("same_save_path", f"ranks {shown}{others} all write {path} with torch.save", cost, fix, where,
                      {"path": path, "ranks": sorted(ranks)}, key=path)
