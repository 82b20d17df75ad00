"""Parse CUDA_VISIBLE_DEVICES the way the CUDA runtime does (pure: no torch).

The rules, as torch.cuda mirrors them (``torch.cuda._parse_visible_devices`` / ``_device_count_nvml``):

- A comma-separated list. If the value starts with ``GPU-`` (or ``MIG-``) every entry must be a UUID (prefix)
  of that kind; otherwise every entry is read like C's ``strtoul``: leading digits count, so ``1gpu2`` means
  1, and an entry without leading digits (``abc``, ``GPU-...`` in an index list, ``-1``) is invalid.
- An empty value hides every GPU.
- The list stops at the first invalid entry: ``0,1,abc,2`` makes devices 0 and 1 visible, silently.
- A duplicate entry makes CUDA see no device at all.
- Against the hardware (``resolve_visible_devices``): an index past the last GPU, or a UUID prefix that
  matches no GPU (or several), also stops the list there.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, field

_LEADING_INT = re.compile(r"[+-]?\d+")


@dataclass(frozen=True)
class VisibleDevices:
    """What CUDA_VISIBLE_DEVICES means."""

    raw: str | None
    entries: tuple[str, ...] = ()  # the entries CUDA will honour, in order (indices normalised: "01" -> "1")
    dropped: tuple[str, ...] = ()  # entries ignored because an earlier one was invalid
    invalid: str | None = None  # the first invalid entry, where the list stops
    duplicates: tuple[str, ...] = ()
    problems: list[str] = field(default_factory=list)
    loose: tuple[tuple[str, str], ...] = ()  # (as written, as CUDA reads it): "1gpu2" -> "1"

    @property
    def is_set(self) -> bool:
        return self.raw is not None

    @property
    def uuid_kind(self) -> str | None:
        """'GPU-' or 'MIG-' when the list is a UUID list, None for an index list."""
        for prefix in ("GPU-", "MIG-"):
            if self.raw is not None and self.raw.startswith(prefix):
                return prefix
        return None

    @property
    def indices(self) -> tuple[int, ...] | None:
        """Integer entries, or None when any entry is a UUID (then only CUDA can map them)."""
        if any(not e.lstrip("-").isdigit() for e in self.entries):
            return None
        return tuple(int(e) for e in self.entries)


def _read_entry(part: str, uuid_prefix: str | None) -> str | None:
    """The entry as CUDA reads it, or None when it is invalid (the list stops there)."""
    if uuid_prefix is not None:
        return part if part.startswith(uuid_prefix) else None  # no stripping: " GPU-x" is invalid
    m = _LEADING_INT.match(part.strip())
    if m is None or int(m.group()) < 0:
        return None
    return str(int(m.group()))


def parse_cuda_visible_devices(raw: str | None) -> VisibleDevices:
    """Parse a CUDA_VISIBLE_DEVICES value (None: unset, all GPUs visible)."""
    if raw is None:
        return VisibleDevices(raw=None)
    if raw.strip() == "":
        return VisibleDevices(raw=raw, problems=["CUDA_VISIBLE_DEVICES is set but empty: no GPU is visible."])
    parts = raw.split(",")
    prefix = VisibleDevices(raw).uuid_kind
    entries: list[str] = []
    loose: list[tuple[str, str]] = []
    invalid = None
    dropped: tuple[str, ...] = ()
    for i, part in enumerate(parts):
        entry = _read_entry(part, prefix)
        rest = tuple(parts[i + 1 :])
        if entry is None:
            if part.strip() == "" and not any(p.strip() for p in rest):
                break  # a trailing comma: CUDA stops, but nothing is lost
            invalid, dropped = part, rest
            break
        if prefix is None and not part.strip().isdigit():
            loose.append((part, entry))
        entries.append(entry)
    dups = sorted({e for e in entries if entries.count(e) > 1}, key=entries.index)
    problems = []
    if invalid is not None:
        kept = f"only {','.join(entries)} is visible" if entries else "no GPU is visible"
        what = f"not a {prefix}UUID (the list started with one)" if prefix else "not a GPU index or UUID"
        problems.append(
            f"CUDA_VISIBLE_DEVICES={raw!r}: entry {invalid!r} is {what}; CUDA stops reading there, so {kept}."
        )
    if dups:
        problems.append(f"CUDA_VISIBLE_DEVICES={raw!r} lists {', '.join(dups)} twice: CUDA then sees no GPU.")
    return VisibleDevices(
        raw=raw,
        entries=tuple(entries),
        dropped=dropped,
        invalid=invalid,
        duplicates=tuple(dups),
        problems=problems,
        loose=tuple(loose),
    )


@dataclass(frozen=True)
class Resolved:
    """Which physical GPUs (nvidia-smi numbering, under CUDA_DEVICE_ORDER=PCI_BUS_ID) CUDA will use."""

    physical: tuple[int, ...] | None  # None: cannot tell (GPU count or UUIDs unknown, MIG devices)
    stop: str | None = None  # the entry where the hardware made CUDA stop reading
    reason: str = ""


def resolve_visible_devices(vis: VisibleDevices, gpu_count: int | None, uuids: Sequence[str] = ()) -> Resolved:
    """Apply a parsed value to the machine's GPUs (``uuids`` as nvidia-smi prints them, GPU-...)."""
    if not vis.is_set:
        return Resolved(None if gpu_count is None else tuple(range(gpu_count)))
    if vis.duplicates or not vis.entries:
        return Resolved(())
    if vis.uuid_kind == "MIG-" or gpu_count is None or (vis.uuid_kind and len(uuids) != gpu_count):
        return Resolved(None)
    found: list[int] = []
    for entry in vis.entries:
        if vis.uuid_kind is None:
            index, why = int(entry), ""
            if index >= gpu_count:
                last = f"0..{gpu_count - 1}" if gpu_count else "none"
                why = f"there is no GPU {index} (this machine has {gpu_count}: {last})"
        else:
            matches = [i for i, u in enumerate(uuids) if u.startswith(entry)]
            index = matches[0] if len(matches) == 1 else -1
            why = "" if len(matches) == 1 else f"{entry!r} matches {len(matches) or 'no'} GPU UUID(s)"
        if why:
            return Resolved(tuple(found), stop=entry, reason=f"{why}; CUDA stops reading at {entry!r}")
        if index in found:
            return Resolved((), stop=entry, reason=f"{entry!r} names GPU {index} again: CUDA then sees no GPU")
        found.append(index)
    return Resolved(tuple(found))
