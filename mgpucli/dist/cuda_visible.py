"""Parse CUDA_VISIBLE_DEVICES the way the CUDA runtime does (pure: no torch).

CUDA reads a comma-separated list of device indices or ``GPU-``/``MIG-`` UUIDs (prefixes allowed). An empty
value hides every GPU. The list stops at the first invalid entry: ``0,1,abc,2`` makes devices 0 and 1
visible, silently. A duplicate entry makes CUDA see no device at all.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

_UUID = re.compile(r"^(GPU|MIG)-[0-9A-Za-z/-]+$")


@dataclass(frozen=True)
class VisibleDevices:
    """What CUDA_VISIBLE_DEVICES means."""

    raw: str | None
    entries: tuple[str, ...] = ()  # the entries CUDA will honour, in order
    dropped: tuple[str, ...] = ()  # entries ignored because an earlier one was invalid
    invalid: str | None = None  # the first invalid entry, where the list stops
    duplicates: tuple[str, ...] = ()
    problems: list[str] = field(default_factory=list)

    @property
    def is_set(self) -> bool:
        return self.raw is not None

    @property
    def indices(self) -> tuple[int, ...] | None:
        """Integer entries, or None when any entry is a UUID (then only CUDA can map them)."""
        if any(not e.lstrip("-").isdigit() for e in self.entries):
            return None
        return tuple(int(e) for e in self.entries)


def parse_cuda_visible_devices(raw: str | None) -> VisibleDevices:
    """Parse a CUDA_VISIBLE_DEVICES value (None: unset, all GPUs visible)."""
    if raw is None:
        return VisibleDevices(raw=None)
    parts = [p.strip() for p in raw.split(",")]
    if raw.strip() == "":
        return VisibleDevices(raw=raw, problems=["CUDA_VISIBLE_DEVICES is set but empty: no GPU is visible."])
    entries: list[str] = []
    invalid = None
    dropped: tuple[str, ...] = ()
    for i, part in enumerate(parts):
        if part.isdigit() or _UUID.match(part):
            entries.append(part)
            continue
        if part.startswith("-") and part[1:].isdigit():
            invalid = part  # a negative index hides itself and everything after it
        else:
            invalid = part
        dropped = tuple(parts[i + 1 :])
        break
    seen: set[str] = set()
    dups = []
    for e in entries:
        key = str(int(e)) if e.isdigit() else e
        if key in seen:
            dups.append(e)
        seen.add(key)
    problems = []
    if invalid is not None:
        kept = ",".join(entries) if entries else "no GPU"
        problems.append(
            f"CUDA_VISIBLE_DEVICES={raw!r}: entry {invalid!r} is not a GPU index or UUID; CUDA stops reading "
            f"there, so only {kept} is visible."
        )
    if dups:
        problems.append(f"CUDA_VISIBLE_DEVICES={raw!r} lists {', '.join(dups)} twice: CUDA then sees no GPU.")
    return VisibleDevices(
        raw=raw, entries=tuple(entries), dropped=dropped, invalid=invalid, duplicates=tuple(dups), problems=problems
    )
